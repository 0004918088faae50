package membership

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func TestLoadRoundTrip(t *testing.T) {
	for _, l := range []Load{
		{},
		{Seq: 1, Boot: 7, PartitionsLed: 3, Backlog: 12, AppendRate: 900},
		{Seq: 1<<64 - 1, Boot: 1<<64 - 1, PartitionsLed: 1<<32 - 1, Backlog: 1<<64 - 1, AppendRate: 1<<32 - 1},
	} {
		b, err := encodeLoad("node-a", l)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > loadBytesMax {
			t.Errorf("%+v: %d bytes, more than %d", l, len(b), loadBytesMax)
		}
		name, got, err := decodeLoad(b)
		if err != nil || name != "node-a" || got != l {
			t.Errorf("round trip of %+v: %q %+v %v", l, name, got, err)
		}
	}
	if _, err := encodeLoad("", Load{}); !errors.Is(err, ErrBadLoad) {
		t.Errorf("empty name: %v, want ErrBadLoad", err)
	}
}

// TestDecodeLoadBadInput: every prefix of a good report, a report with
// trailing bytes, a 32-bit field out of range and random bytes give
// ErrBadLoad, never a panic.
func TestDecodeLoadBadInput(t *testing.T) {
	good, err := encodeLoad("n1", Load{Seq: 300, Boot: 9, PartitionsLed: 2, Backlog: 1 << 40, AppendRate: 5})
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(good) {
		if _, _, err := decodeLoad(good[:i]); !errors.Is(err, ErrBadLoad) {
			t.Errorf("prefix of %d bytes: %v, want ErrBadLoad", i, err)
		}
	}
	if _, _, err := decodeLoad(append(good[:len(good):len(good)], 0)); !errors.Is(err, ErrBadLoad) {
		t.Errorf("trailing byte: %v", err)
	}
	bad := append([]byte(nil), good...)
	bad[1] = 2
	if _, _, err := decodeLoad(bad); !errors.Is(err, ErrBadLoad) {
		t.Errorf("version 2: %v", err)
	}
	// PartitionsLed of 2^32 does not fit its field.
	big := []byte{msgLoad, loadVersion, 1, 'x', 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0}
	if _, _, err := decodeLoad(big); !errors.Is(err, ErrBadLoad) {
		t.Errorf("led 2^32: %v", err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		b := make([]byte, r.IntN(64))
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		if r.IntN(2) == 0 && len(b) > 2 {
			b[0], b[1] = msgLoad, loadVersion
		}
		if _, _, err := decodeLoad(b); err != nil && !errors.Is(err, ErrBadLoad) {
			t.Fatalf("%x: %v, not ErrBadLoad", b, err)
		}
	}
}

// loadView is a Membership without memberlist, for the report bookkeeping.
func loadView(now *time.Time) *Membership {
	return &Membership{
		self: "self", loadInterval: time.Second, now: func() time.Time { return *now },
		table: map[string]*Member{
			"a":    {Name: "a", State: StateAlive},
			"b":    {Name: "b", State: StateAlive},
			"dead": {Name: "dead", State: StateDead},
		},
		loads: map[string]peerLoad{}, pending: map[string]*Event{}, kick: make(chan struct{}, 1),
	}
}

func report(t *testing.T, name string, l Load) []byte {
	t.Helper()
	b, err := encodeLoad(name, l)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLoadKeptFreshThenStale(t *testing.T) {
	now := time.Unix(1000, 0)
	m := loadView(&now)
	d := &delegate{m: m}
	d.NotifyMsg(report(t, "a", Load{Seq: 5, Boot: 1, Backlog: 10}))
	d.NotifyMsg(report(t, "stranger", Load{Seq: 1, Boot: 1}))
	d.NotifyMsg(report(t, "dead", Load{Seq: 1, Boot: 1}))
	d.NotifyMsg(report(t, "self", Load{Seq: 1, Boot: 1}))
	d.NotifyMsg([]byte{msgLoad, loadVersion, 200})
	if got := m.Loads(); len(got) != 1 || got["a"].Backlog != 10 || got["a"].Age != 0 {
		t.Fatalf("loads %+v, want only a's", got)
	}
	if m.Stats().BadLoads != 1 {
		t.Errorf("BadLoads %d, want 1", m.Stats().BadLoads)
	}
	// An older or equal sequence of the same run is dropped; a new run
	// (another Boot) is taken whatever its sequence.
	now = now.Add(time.Second)
	d.NotifyMsg(report(t, "a", Load{Seq: 4, Boot: 1, Backlog: 99}))
	d.NotifyMsg(report(t, "a", Load{Seq: 5, Boot: 1, Backlog: 99}))
	if got := m.Loads()["a"]; got.Backlog != 10 || got.Age != time.Second {
		t.Fatalf("after older reports: %+v", got)
	}
	d.NotifyMsg(report(t, "a", Load{Seq: 1, Boot: 2, Backlog: 20}))
	if got := m.Loads()["a"]; got.Backlog != 20 || got.Age != 0 {
		t.Fatalf("after a new run's report: %+v", got)
	}
	// Fresh up to three intervals, stale after.
	now = now.Add(3 * time.Second)
	if _, ok := m.FreshLoads()["a"]; !ok {
		t.Fatal("a report three intervals old is stale")
	}
	now = now.Add(time.Millisecond)
	if _, ok := m.FreshLoads()["a"]; ok {
		t.Fatal("a report more than three intervals old is fresh")
	}
	if _, ok := m.Loads()["a"]; !ok {
		t.Fatal("Loads drops a stale report")
	}
	// A peer that dies loses its report.
	m.mu.Lock()
	m.setLocked("a", StateDead, "", Meta{}, nil)
	m.mu.Unlock()
	if got := m.Loads(); len(got) != 0 {
		t.Fatalf("after a's death: %+v", got)
	}
}

// TestLoadSpreads: a node's report reaches its peers over memberlist.
func TestLoadSpreads(t *testing.T) {
	nodes := startCluster(t, 3)
	nodes[0].m.SetLoadSource(func() Load { return Load{PartitionsLed: 4, Backlog: 77, AppendRate: 12} })
	deadline := time.Now().Add(waitMax)
	for {
		// Send at once rather than wait for the loop's interval; UDP may
		// drop one, so send until both peers have it.
		nodes[0].m.reportLoad()
		got1, ok1 := nodes[1].m.FreshLoads()["n0"]
		got2, ok2 := nodes[2].m.FreshLoads()["n0"]
		if ok1 && ok2 {
			for _, got := range []PeerLoad{got1, got2} {
				if got.PartitionsLed != 4 || got.Backlog != 77 || got.AppendRate != 12 || got.Seq == 0 {
					t.Fatalf("peer holds %+v", got)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n0's report did not reach its peers within %v", waitMax)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if l, ok := nodes[0].m.LocalLoad(); !ok || l.Backlog != 77 {
		t.Errorf("LocalLoad %+v %v", l, ok)
	}
	if _, ok := nodes[1].m.LocalLoad(); ok {
		t.Error("a node without a source has a local report")
	}
}
