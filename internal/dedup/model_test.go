package dedup

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// mprod is the model's view of one producer: every sequence it remembers,
// in a map, and the floor.
type mprod struct {
	seqs   map[uint64]uint64
	floor  uint64
	lastMs int64
}

// model is the plain reference: maps, a slice of ids in order of their last
// record, and linear scans for everything.
type model struct {
	cfg     Config
	prods   map[string]*mprod
	order   []string // least recently recorded first
	clockMs int64
	idle    uint64
	limit   uint64
	// forgotten lists producers evicted at some point: the only ones whose
	// old sequences may be answered Fresh.
	forgotten map[string]bool
}

func newModel(cfg Config) *model {
	return &model{cfg: cfg.normalized(), prods: map[string]*mprod{}, forgotten: map[string]bool{}}
}

func (m *model) entries() int {
	n := 0
	for _, p := range m.prods {
		n += len(p.seqs)
	}
	return n
}

func (m *model) evict(id string) {
	delete(m.prods, id)
	m.order = slices.DeleteFunc(m.order, func(s string) bool { return s == id })
	m.forgotten[id] = true
}

func (m *model) check(id string, seq uint64, now int64) (Verdict, uint64) {
	p := m.prods[id]
	if id == "" || p == nil || p.lastMs+m.cfg.IdleMs <= now {
		return Fresh, 0
	}
	if off, ok := p.seqs[seq]; ok {
		return Duplicate, off
	}
	if seq <= p.floor {
		return TooOld, 0
	}
	return Fresh, 0
}

func (m *model) record(id string, seq, off uint64, at int64) {
	if id == "" {
		return
	}
	m.clockMs = max(m.clockMs, at)
	for len(m.order) > 0 && m.prods[m.order[0]].lastMs+m.cfg.IdleMs <= m.clockMs {
		m.evict(m.order[0])
		m.idle++
	}
	p := m.prods[id]
	if p == nil {
		if len(m.prods) >= m.cfg.ProducersMax {
			m.evict(m.order[0])
			m.limit++
		}
		p = &mprod{seqs: map[uint64]uint64{}}
		m.prods[id] = p
	}
	m.order = slices.DeleteFunc(m.order, func(s string) bool { return s == id })
	m.order = append(m.order, id)
	p.lastMs = m.clockMs
	if _, ok := p.seqs[seq]; !ok && seq > p.floor {
		p.seqs[seq] = off
		if len(p.seqs) > m.cfg.WindowSeqs {
			lowest := uint64(1<<64 - 1)
			for s := range p.seqs {
				lowest = min(lowest, s)
			}
			delete(p.seqs, lowest)
			p.floor = max(p.floor, lowest)
		}
	}
	for m.entries() > m.cfg.EntriesMax && m.order[0] != id {
		m.evict(m.order[0])
		m.limit++
	}
}

// TestModel drives a Table and the model with the same random records and
// compares every answer, the counters, and a table restored from a snapshot.
func TestModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := Config{
			WindowSeqs:   rapid.IntRange(1, 8).Draw(t, "window"),
			ProducersMax: rapid.IntRange(1, 4).Draw(t, "producers"),
			EntriesMax:   rapid.IntRange(1, 20).Draw(t, "entries"),
			IdleMs:       int64(rapid.IntRange(1, 50).Draw(t, "idle")),
		}
		tab, mod := New(cfg), newModel(cfg)
		ids := []string{"", "a", "b", "c", "d", "e"}
		// stored remembers every (id, seq) recorded, for the safety check.
		stored := map[string]uint64{}
		now, off := int64(0), uint64(0)
		probe := func(t *rapid.T, tab *Table, label string) {
			for _, id := range ids {
				for seq := range uint64(24) {
					gv, go_ := tab.Check(id, seq, now)
					mv, mo := mod.check(id, seq, now)
					if gv != mv || go_ != mo {
						t.Fatalf("%s: check(%q, %d, now %d) = %v %d, model %v %d", label, id, seq, now, gv, go_, mv, mo)
					}
					k := fmt.Sprintf("%s/%d", id, seq)
					if _, was := stored[k]; was && gv == Fresh && !mod.forgotten[id] &&
						mod.prods[id] != nil && mod.prods[id].lastMs+mod.cfg.IdleMs > now {
						t.Fatalf("%s: %s stored and its producer remembered, but checked fresh", label, k)
					}
				}
			}
		}
		steps := rapid.IntRange(1, 120).Draw(t, "steps")
		for range steps {
			now += int64(rapid.IntRange(0, 6).Draw(t, "dt"))
			id := rapid.SampledFrom(ids).Draw(t, "id")
			seq := uint64(rapid.IntRange(0, 23).Draw(t, "seq"))
			// The partition records only what Check let it store.
			if v, _ := tab.Check(id, seq, now); v != Fresh {
				continue
			}
			off++
			tab.Record(id, seq, off, now)
			mod.record(id, seq, off, now)
			if id != "" {
				stored[fmt.Sprintf("%s/%d", id, seq)] = off
			}
			st := tab.Stats()
			if st.Producers != len(mod.prods) || st.Entries != mod.entries() ||
				st.EvictedIdle != mod.idle || st.EvictedLimit != mod.limit {
				t.Fatalf("stats %+v, model producers %d entries %d idle %d limit %d",
					st, len(mod.prods), mod.entries(), mod.idle, mod.limit)
			}
			if st.Producers > tab.cfg.ProducersMax || st.Entries > tab.cfg.EntriesMax {
				t.Fatalf("stats %+v beyond the bounds %+v", st, tab.cfg)
			}
			probe(t, tab, "live")
		}
		snap := tab.Snapshot(nil)
		back, err := Restore(cfg, snap)
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		probe(t, back, "restored")
		if again := back.Snapshot(nil); !bytes.Equal(again, snap) {
			t.Fatalf("snapshot of the restored table differs")
		}
		// Records after a restore continue as they would have.
		id := rapid.SampledFrom(ids[1:]).Draw(t, "after id")
		seq := uint64(rapid.IntRange(0, 23).Draw(t, "after seq"))
		if v, _ := tab.Check(id, seq, now); v == Fresh {
			tab.Record(id, seq, off+1, now)
			back.Record(id, seq, off+1, now)
			mod.record(id, seq, off+1, now)
			if !bytes.Equal(tab.Snapshot(nil), back.Snapshot(nil)) {
				t.Fatalf("live and restored tables diverge after a record")
			}
			probe(t, back, "restored+1")
		}
	})
}
