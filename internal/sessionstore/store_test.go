package sessionstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

func hashOf(i int) (h [TokenHashBytes]byte) {
	h[0], h[1] = byte(i), byte(i>>8)
	return h
}

func openMem(t *testing.T, fsys vfs.FS, every int) *Store {
	t.Helper()
	s, err := Open(Options{FS: fsys, Dir: "/data/sessions", CheckpointEveryRecords: every})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// asMap is a store's sessions by client id, for comparisons.
func asMap(ss []Session) map[string]Session {
	m := make(map[string]Session, len(ss))
	for _, s := range ss {
		if len(s.Subs) == 0 {
			s.Subs = nil
		}
		m[s.ClientID] = s
	}
	return m
}

func TestRoundTripAndBoot(t *testing.T) {
	fsys := vfs.NewMem()
	s := openMem(t, fsys, 0)
	if s.Boot() != 1 || s.NextSubID() != 1 || len(s.Restored()) != 0 {
		t.Fatalf("fresh store: boot %d next %d restored %d", s.Boot(), s.NextSubID(), len(s.Restored()))
	}
	must(t, s.Create("c-1", "own", "user:alice", hashOf(1)))
	must(t, s.Create("c-2", "own", "token:token#1", hashOf(2)))
	must(t, s.Subscribe("c-1", Sub{ID: 7, Topic: "t", Group: "g", Partition: -1, AckMode: 0, Prefetch: 10}))
	must(t, s.Subscribe("c-1", Sub{ID: 3, Topic: "t2", Group: "", Partition: 2, AckMode: 1, Prefetch: 1}))
	must(t, s.Subscribe("c-2", Sub{ID: 9, Topic: "t", Group: "g", Partition: 0, Prefetch: 5}))
	must(t, s.Unsubscribe("c-2", 9))
	must(t, s.Create("c-3", "own", "user:alice", hashOf(3)))
	must(t, s.End("c-3"))
	must(t, s.Close())

	s = openMem(t, fsys, 0)
	defer s.Close()
	want := map[string]Session{
		"c-1": {ClientID: "c-1", OwnerID: "own", Principal: "user:alice", TokenHash: hashOf(1), Subs: []Sub{
			{ID: 3, Topic: "t2", Partition: 2, AckMode: 1, Prefetch: 1},
			{ID: 7, Topic: "t", Group: "g", Partition: -1, Prefetch: 10}}},
		"c-2": {ClientID: "c-2", OwnerID: "own", Principal: "token:token#1", TokenHash: hashOf(2)},
	}
	if got := asMap(s.Restored()); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored\n got %+v\nwant %+v", got, want)
	}
	if s.Boot() != 2 {
		t.Fatalf("boot %d, want 2", s.Boot())
	}
	// Subscription 9 ended, but its id is never handed out again.
	if s.NextSubID() != 10 {
		t.Fatalf("next sub id %d, want 10", s.NextSubID())
	}
}

func TestCheckpointCompactsLog(t *testing.T) {
	fsys := vfs.NewMem()
	s := openMem(t, fsys, 8)
	for i := range 100 {
		id := fmt.Sprintf("c-%d", i)
		must(t, s.Create(id, "own", "user:alice", hashOf(i)))
		must(t, s.Subscribe(id, Sub{ID: uint64(i + 1), Topic: "t", Partition: -1, Prefetch: 1}))
		if i%2 == 0 {
			must(t, s.End(id))
		}
	}
	if segs := s.log.Segments(); len(segs) > 2 {
		t.Fatalf("%d log segments after checkpoints, want at most 2", len(segs))
	}
	must(t, s.Close())
	s = openMem(t, fsys, 8)
	defer s.Close()
	if n := len(s.Restored()); n != 50 {
		t.Fatalf("restored %d sessions, want 50", n)
	}
	if s.NextSubID() != 101 {
		t.Fatalf("next sub id %d, want 101", s.NextSubID())
	}
}

func TestDamagedCheckpointFailsOpen(t *testing.T) {
	fsys := vfs.NewMem()
	s := openMem(t, fsys, 0)
	must(t, s.Create("c-1", "own", "user:alice", hashOf(1)))
	must(t, s.Persist())
	must(t, s.Close())
	if err := fsys.FlipBit("/data/sessions/checkpoint", 30, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{FS: fsys, Dir: "/data/sessions"}); err == nil {
		t.Fatal("Open accepted a damaged checkpoint")
	}
}

func TestClosedRefusesWrites(t *testing.T) {
	s := openMem(t, vfs.NewMem(), 0)
	must(t, s.Close())
	if err := s.Create("c-1", "own", "user:alice", hashOf(1)); err != ErrClosed {
		t.Fatalf("Create after Close: %v, want ErrClosed", err)
	}
}

// TestCrash runs random session records against a MemFS, simulates power
// loss (with torn writes) at a random point, reopens and checks that the
// restored state is the model's state after some prefix of the operations
// that includes everything up to the last durable point (a Subscribe or a
// Persist that returned), and that no subscription id below one already
// handed out is offered again.
func TestCrash(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { crashRun(t, seed) })
	}
}

type op struct {
	typ  uint8
	id   string
	sub  Sub
	hash [TokenHashBytes]byte
}

func crashRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5e55))
	fsys := vfs.NewMem()
	// The data dir exists and is durable, as sinew serve leaves it.
	must(t, fsys.MkdirAll("/data", 0o755))
	must(t, fsys.SyncDir("/"))
	s := openMem(t, fsys, 1+rng.IntN(20))
	var ops []op
	durable := 0 // ops[:durable] must survive
	live := map[string][]uint64{}
	next := uint64(1)
	for range 50 + rng.IntN(150) {
		ids := slices.Sorted(maps.Keys(live))
		switch k := rng.IntN(10); {
		case k < 3 || len(ids) == 0:
			id := fmt.Sprintf("c-%d", len(ops))
			o := op{typ: recCreate, id: id, hash: hashOf(len(ops))}
			must(t, s.Create(id, "own", "user:alice", o.hash))
			ops = append(ops, o)
			live[id] = nil
		case k < 7:
			id := ids[rng.IntN(len(ids))]
			sub := Sub{ID: next, Topic: "t", Group: "g", Partition: int32(rng.IntN(3)) - 1, Prefetch: uint32(rng.IntN(100))}
			next++
			must(t, s.Subscribe(id, sub))
			ops = append(ops, op{typ: recSubscribe, id: id, sub: sub})
			live[id] = append(live[id], sub.ID)
			durable = len(ops)
		case k < 8 && len(live[ids[0]]) > 0:
			id := ids[0]
			sid := live[id][0]
			live[id] = live[id][1:]
			must(t, s.Unsubscribe(id, sid))
			ops = append(ops, op{typ: recUnsubscribe, id: id, sub: Sub{ID: sid}})
		case k < 9:
			id := ids[rng.IntN(len(ids))]
			must(t, s.End(id))
			ops = append(ops, op{typ: recEnd, id: id})
			delete(live, id)
		default:
			must(t, s.Persist())
			durable = len(ops)
		}
	}
	img := fsys.Crash(rng, true)
	r, err := Open(Options{FS: img, Dir: "/data/sessions"})
	if err != nil {
		t.Fatalf("reopen after crash: %v", err)
	}
	defer r.Close()
	got := asMap(r.Restored())
	for n := len(ops); n >= durable; n-- {
		if reflect.DeepEqual(got, model(ops[:n])) {
			if n < len(ops) {
				t.Logf("lost the last %d unsynced ops", len(ops)-n)
			}
			if r.NextSubID() < maxSub(ops[:n])+1 {
				t.Fatalf("next sub id %d reuses ids of the %d surviving ops", r.NextSubID(), n)
			}
			return
		}
	}
	t.Fatalf("restored state matches no prefix of at least %d of %d ops:\n%+v", durable, len(ops), got)
}

func model(ops []op) map[string]Session {
	st := newState()
	for _, o := range ops {
		switch o.typ {
		case recCreate:
			st.sessions[o.id] = &Session{ClientID: o.id, OwnerID: "own", Principal: "user:alice", TokenHash: o.hash}
		case recSubscribe:
			if x := st.sessions[o.id]; x != nil {
				x.Subs = insertSub(x.Subs, o.sub)
			}
		case recUnsubscribe:
			if x := st.sessions[o.id]; x != nil {
				x.Subs = removeSub(x.Subs, o.sub.ID)
			}
		case recEnd:
			delete(st.sessions, o.id)
		}
	}
	var out []Session
	for _, x := range st.sessions {
		out = append(out, cloneSession(x))
	}
	return asMap(out)
}

func maxSub(ops []op) uint64 {
	var m uint64
	for _, o := range ops {
		if o.typ == recSubscribe {
			m = max(m, o.sub.ID)
		}
	}
	return m
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestReadsFormatWithoutPrincipal: a store written before sessions recorded
// their principal (create records of type 1, checkpoints of version 1) still
// opens, its sessions with principal "", beside new ones that have it.
func TestReadsFormatWithoutPrincipal(t *testing.T) {
	// A version-1 checkpoint, laid out as that version wrote it.
	fsys := vfs.NewMem()
	must(t, fsys.MkdirAll("/data/sessions", 0o755))
	var b []byte
	b = append(b, ckptMagic...)
	b = append(b, ckptVersionNoPrincipal)
	b = binary.LittleEndian.AppendUint64(b, 0) // covers
	b = binary.LittleEndian.AppendUint64(b, 4) // boot
	b = binary.LittleEndian.AppendUint64(b, 9) // next_sub_id
	b = binary.AppendUvarint(b, 1)
	b = appendStr(b, "c-old")
	b = appendStr(b, "own")
	h := hashOf(7)
	b = append(b, h[:]...)
	b = binary.AppendUvarint(b, 1)
	b = appendSub(b, Sub{ID: 8, Topic: "t", Partition: -1, Prefetch: 3})
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	must(t, vfs.WriteFileAtomic(fsys, "/data/sessions/"+ckptFile, b))

	s := openMem(t, fsys, 0)
	// A create record as the old version wrote it, then a new one.
	old := appendStr(nil, "c-log")
	old = appendStr(old, "own")
	h2 := hashOf(8)
	old = append(old, h2[:]...)
	s.mu.Lock()
	must(t, s.appendLocked(recCreate, old))
	s.mu.Unlock()
	must(t, s.Create("c-new", "own", "user:bob", hashOf(9)))
	must(t, s.Close())

	s = openMem(t, fsys, 0)
	defer s.Close()
	want := map[string]Session{
		"c-old": {ClientID: "c-old", OwnerID: "own", TokenHash: hashOf(7), Subs: []Sub{{ID: 8, Topic: "t", Partition: -1, Prefetch: 3}}},
		"c-log": {ClientID: "c-log", OwnerID: "own", TokenHash: hashOf(8)},
		"c-new": {ClientID: "c-new", OwnerID: "own", Principal: "user:bob", TokenHash: hashOf(9)},
	}
	if got := asMap(s.Restored()); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored\n got %+v\nwant %+v", got, want)
	}
	if s.Boot() != 6 || s.NextSubID() != 9 {
		t.Fatalf("boot %d next %d, want 6 and 9", s.Boot(), s.NextSubID())
	}
}

// TestCohortSubscriptionsSurvive: a cohort member's subscription keeps its
// cohort and member id through the log and through a checkpoint.
func TestCohortSubscriptionsSurvive(t *testing.T) {
	for _, every := range []int{0, 1} {
		fsys := vfs.NewMem()
		s := openMem(t, fsys, every)
		must(t, s.Create("c-1", "own", "user:alice", hashOf(1)))
		want := []Sub{
			{ID: 1, Topic: "orders", Partition: -1, Prefetch: 8, Cohort: "billing", Member: "worker-1"},
			{ID: 2, Topic: "audit", Partition: 0, Prefetch: 1},
		}
		for _, sub := range want {
			must(t, s.Subscribe("c-1", sub))
		}
		must(t, s.Close())
		s = openMem(t, fsys, every)
		got := s.Restored()
		s.Close()
		if len(got) != 1 || !slices.Equal(got[0].Subs, want) {
			t.Fatalf("checkpoint every %d: restored %+v, want subs %+v", every, got, want)
		}
	}
}
