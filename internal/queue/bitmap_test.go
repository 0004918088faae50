package queue

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestBitmapModel drives the bitmap alone against a map: bits added at the
// top (with gaps of up to several chunks), removed, made stateful and
// fresh in any order, and checks every query against the map after each
// step, with compaction as eager as the slack allows.
func TestBitmapModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		type bit struct {
			plain, fresh bool
			pos          uint32
		}
		b := &bitmap{slack: rapid.SampledFrom([]int{0, 1, 64}).Draw(t, "slack")}
		m := map[uint64]*bit{}
		next := rapid.Uint64Range(0, 3*chunkLSNs).Draw(t, "first")
		var posSeq uint32
		pick := func(t *rapid.T, want func(*bit) bool) (uint64, bool) {
			var offs []uint64
			for off, x := range m {
				if want(x) {
					offs = append(offs, off)
				}
			}
			if len(offs) == 0 {
				return 0, false
			}
			slices.Sort(offs)
			return rapid.SampledFrom(offs).Draw(t, "off"), true
		}
		t.Repeat(map[string]func(*rapid.T){
			"add": func(t *rapid.T) {
				next += rapid.SampledFrom([]uint64{0, 0, 1, 5, chunkLSNs - 1, chunkLSNs, 4 * chunkLSNs}).Draw(t, "skip")
				plain := rapid.Bool().Draw(t, "plain")
				posSeq++
				b.add(next, plain, posSeq)
				m[next] = &bit{plain: plain, pos: posSeq}
				if !plain && rapid.Bool().Draw(t, "fresh") {
					b.setFresh(next)
					m[next].fresh = true
				}
				next++
			},
			"addMany": func(t *rapid.T) {
				n := rapid.IntRange(1, 2*chunkLSNs).Draw(t, "n")
				for range n {
					b.add(next, true, 0)
					m[next] = &bit{plain: true}
					next++
				}
			},
			"remove": func(t *rapid.T) {
				off, ok := pick(t, func(*bit) bool { return true })
				if !ok {
					return
				}
				if m[off].fresh && rapid.Bool().Draw(t, "clearFirst") {
					b.clearFresh(off)
				}
				b.remove(off)
				delete(m, off)
			},
			"removeChunk": func(t *rapid.T) {
				// Empties one chunk, often not the first, so empty chunks
				// wait between live ones.
				off, ok := pick(t, func(*bit) bool { return true })
				if !ok {
					return
				}
				for o := range m {
					if chunkBase(o) == chunkBase(off) {
						b.remove(o)
						delete(m, o)
					}
				}
			},
			"removeLowest": func(t *rapid.T) {
				n := rapid.IntRange(1, chunkLSNs+3).Draw(t, "n")
				for range n {
					off, ok := b.first()
					if !ok {
						return
					}
					b.remove(off)
					delete(m, off)
				}
			},
			"unplain": func(t *rapid.T) {
				off, ok := pick(t, func(x *bit) bool { return x.plain })
				if !ok {
					return
				}
				posSeq++
				b.unplain(off, posSeq)
				*m[off] = bit{pos: posSeq}
			},
			"clearFresh": func(t *rapid.T) {
				off, ok := pick(t, func(x *bit) bool { return x.fresh })
				if !ok {
					return
				}
				b.clearFresh(off)
				m[off].fresh = false
			},
			"setPos": func(t *rapid.T) {
				off, ok := pick(t, func(x *bit) bool { return !x.plain })
				if !ok {
					return
				}
				posSeq++
				b.setPos(off, posSeq)
				m[off].pos = posSeq
			},
			"": func(t *rapid.T) {
				var all, plain, wait, state []uint64
				for off, x := range m {
					all = append(all, off)
					if x.plain {
						plain = append(plain, off)
					} else {
						state = append(state, off)
					}
					if x.plain || x.fresh {
						wait = append(wait, off)
					}
				}
				for _, s := range [][]uint64{all, plain, wait, state} {
					slices.Sort(s)
				}
				if f, ok := b.first(); ok != (len(all) > 0) || ok && f != all[0] {
					t.Fatalf("first %d,%v want %v", f, ok, all)
				}
				var gotStates []uint64
				for off, pos := range b.states() {
					if m[off] == nil || m[off].plain || m[off].pos != pos {
						t.Fatalf("states yields %d at %d, model %+v", off, pos, m[off])
					}
					gotStates = append(gotStates, off)
				}
				if !slices.Equal(gotStates, state) {
					t.Fatalf("states %v want %v", gotStates, state)
				}
				from := rapid.Uint64Range(0, next+1).Draw(t, "from")
				for kind, want := range map[int][]uint64{anyLive: all, onlyPlain: plain, waiting: wait, withState: state} {
					i, _ := slices.BinarySearch(want, from)
					got, ok := b.nextOf(from, kind)
					if ok != (i < len(want)) || ok && got != want[i] {
						t.Fatalf("nextOf(%d, %d) = %d,%v want %v", from, kind, got, ok, want[i:])
					}
					if got := slices.Collect(b.from(from, kind)); !slices.Equal(got, want[i:]) && len(got)+len(want[i:]) > 0 {
						t.Fatalf("from(%d, %d) = %v want %v", from, kind, got, want[i:])
					}
				}
				for off := range uint64(next + 1) {
					x := m[off]
					pos, kind := b.lookup(off)
					switch {
					case x == nil && kind != anyLive, x != nil && x.plain && kind != onlyPlain,
						x != nil && !x.plain && (kind != withState || pos != x.pos):
						t.Fatalf("lookup %d = %d,%d, model %+v", off, pos, kind, x)
					}
					if b.isLive(off) != (x != nil) {
						t.Fatalf("isLive %d", off)
					}
				}
				live := len(b.chunks) - b.head - b.empty
				if b.empty > live+b.slack+1 {
					t.Fatalf("%d empty chunks for %d live (slack %d)", b.empty, live, b.slack)
				}
			},
		})
	})
}
