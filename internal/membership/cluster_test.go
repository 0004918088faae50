package membership

import (
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives its test, ours and
// memberlist's alike, with one exception: memberlist's Shutdown does not
// wait for a probe in flight, which ends on its own within one probe
// interval.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

// errCut is what a cut link returns.
var errCut = errors.New("link cut by test")

// filterTransport is memberlist's own UDP and TCP transport with links the
// test can cut: a packet to a blocked address is dropped and a dial to it
// fails. Cutting both directions (each side blocks the other) is a
// network partition.
type filterTransport struct {
	*memberlist.NetTransport
	mu      sync.Mutex
	blocked map[string]bool
}

func (f *filterTransport) cut(addr string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.blocked[addr]
}

func (f *filterTransport) setBlocked(addrs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blocked = map[string]bool{}
	for _, a := range addrs {
		f.blocked[a] = true
	}
}

func (f *filterTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if f.cut(addr) {
		return time.Now(), nil // lost in the network, as UDP is
	}
	return f.NetTransport.WriteTo(b, addr)
}

func (f *filterTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return f.WriteTo(b, a.Addr)
}

func (f *filterTransport) DialTimeout(addr string, d time.Duration) (net.Conn, error) {
	if f.cut(addr) {
		return nil, errCut
	}
	return f.NetTransport.DialTimeout(addr, d)
}

func (f *filterTransport) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	return f.DialTimeout(a.Addr, d)
}

func testLogger(t *testing.T, id string) *log.Logger {
	if !testing.Verbose() {
		return nil
	}
	return log.New(os.Stderr, id+" ", log.Lmicroseconds)
}

type node struct {
	m  *Membership
	tr *filterTransport
}

// startCluster starts n nodes on loopback with OS-chosen ports and the LAN
// profile, each joining the first, and waits until every node sees every
// other alive.
func startCluster(t *testing.T, n int) []*node {
	t.Helper()
	nodes := make([]*node, n)
	for i := range n {
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		tr := &filterTransport{NetTransport: nt}
		var seeds []string
		if i > 0 {
			seeds = []string{nodes[0].m.Addr()}
		}
		id := fmt.Sprintf("n%d", i)
		m, err := New(Config{
			Meta:      Meta{NodeID: id, ClientAddr: id + ":client", PeerAddr: id + ":peer"},
			Profile:   LANProfile(),
			Seeds:     seeds,
			Transport: tr,
			Logger:    testLogger(t, id),
		})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = &node{m: m, tr: tr}
		t.Cleanup(func() { _ = m.Close() })
	}
	for i, nd := range nodes {
		awaitView(t, nd, fmt.Sprintf("n%d sees everyone alive", i), func() bool {
			alive := 0
			for _, p := range nd.m.Members() {
				if p.State == StateAlive {
					alive++
				}
			}
			return alive == n-1
		})
	}
	return nodes
}

// waitMax bounds every wait. It is far above the LAN profile's detection
// time (1.5 s plus a probe round) so that a loaded machine does not fail
// the test; it is a bound, not an expectation.
const waitMax = 30 * time.Second

// awaitEvent reads nd's events until one matches, failing after waitMax.
func awaitEvent(t *testing.T, nd *node, what string, match func(Event) bool) Event {
	t.Helper()
	deadline := time.After(waitMax)
	for {
		select {
		case ev, ok := <-nd.m.Events():
			if !ok {
				t.Fatalf("%s: events closed", what)
			}
			if match(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("%s: not within %v; members %+v", what, waitMax, nd.m.Members())
		}
	}
}

// awaitView reads nd's events until cond holds of its view (checked at
// start and after each event), failing after waitMax.
func awaitView(t *testing.T, nd *node, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(waitMax)
	for !cond() {
		select {
		case _, ok := <-nd.m.Events():
			if !ok {
				t.Fatalf("%s: events closed", what)
			}
		case <-deadline:
			t.Fatalf("%s: not within %v; members %+v", what, waitMax, nd.m.Members())
		}
	}
}

func stateOf(nd *node, name string) State {
	for _, p := range nd.m.Members() {
		if p.Name == name {
			return p.State
		}
	}
	return 0
}

func TestMetaSpreads(t *testing.T) {
	nodes := startCluster(t, 3)
	for _, p := range nodes[2].m.Members() {
		want := Meta{NodeID: p.Name, ClientAddr: p.Name + ":client", PeerAddr: p.Name + ":peer"}
		if p.Meta != want || p.MetaErr != nil {
			t.Errorf("n2 sees %s with meta %+v (%v), want %+v", p.Name, p.Meta, p.MetaErr, want)
		}
	}
}

func TestCrashIsDead(t *testing.T) {
	nodes := startCluster(t, 3)
	killed := time.Now()
	if err := nodes[2].m.Close(); err != nil { // no Leave: a crash to the others
		t.Fatal(err)
	}
	for i, nd := range nodes[:2] {
		ev := awaitEvent(t, nd, fmt.Sprintf("n%d sees n2 dead", i), func(ev Event) bool {
			return ev.Node == "n2" && ev.Kind == EventDead
		})
		if ev.Meta.PeerAddr != "n2:peer" {
			t.Errorf("dead event meta %+v", ev.Meta)
		}
		t.Logf("n%d saw n2 dead %v after the crash (LAN worst case %v after the first failed probe)",
			i, time.Since(killed).Round(time.Millisecond), LANProfile().WorstCaseDetection(3))
		// One of two peers gone is not a majority.
		if nd.m.Fenced() {
			t.Errorf("n%d fenced with one of two peers dead", i)
		}
	}
}

func TestLeaveIsLeft(t *testing.T) {
	nodes := startCluster(t, 3)
	if err := nodes[2].m.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := nodes[2].m.Close(); err != nil {
		t.Fatal(err)
	}
	for i, nd := range nodes[:2] {
		awaitEvent(t, nd, fmt.Sprintf("n%d sees n2 leave", i), func(ev Event) bool {
			if ev.Node == "n2" && ev.Kind == EventDead {
				t.Errorf("n%d saw n2 dead, not left", i)
			}
			return ev.Node == "n2" && ev.Kind == EventLeave
		})
		if nd.m.Fenced() {
			t.Errorf("n%d fenced after a leave", i)
		}
	}
}

func TestPartitionFencesMinority(t *testing.T) {
	nodes := startCluster(t, 5)
	iso := nodes[4]
	var others []string
	for _, nd := range nodes[:4] {
		others = append(others, nd.m.Addr())
		nd.tr.setBlocked(iso.m.Addr())
	}
	iso.tr.setBlocked(others...)

	awaitEvent(t, iso, "n4 fences", func(ev Event) bool { return ev.Kind == EventFenced && ev.Node == "n4" })
	if !iso.m.Fenced() {
		t.Fatal("Fenced() false after EventFenced")
	}
	for i, nd := range nodes[:4] {
		awaitEvent(t, nd, fmt.Sprintf("n%d sees n4 dead", i), func(ev Event) bool {
			if ev.Kind == EventFenced {
				t.Errorf("n%d of the majority fenced", i)
			}
			return ev.Node == "n4" && ev.Kind == EventDead
		})
		if nd.m.Fenced() {
			t.Errorf("n%d of the majority is fenced", i)
		}
	}

	for _, nd := range nodes {
		nd.tr.setBlocked()
	}
	awaitEvent(t, iso, "n4 unfences on heal", func(ev Event) bool { return ev.Kind == EventUnfenced })
	for i, nd := range nodes[:4] {
		awaitView(t, nd, fmt.Sprintf("n%d sees n4 alive again", i), func() bool { return stateOf(nd, "n4") == StateAlive })
	}
	awaitView(t, iso, "n4 sees everyone alive", func() bool {
		for _, p := range iso.m.Members() {
			if p.State != StateAlive {
				return false
			}
		}
		return true
	})
	if iso.m.Stats().ReconnectAttempts == 0 {
		t.Error("healed without a reconnect attempt; the reconnect loop is untested")
	}
}

// TestEventsCoalesce: a reader that does not read loses no node's latest
// state; transitions of one node fold into one pending event.
func TestEventsCoalesce(t *testing.T) {
	m := &Membership{self: "me", pending: map[string]*Event{}, table: map[string]*Member{}, kick: make(chan struct{}, 1)}
	set := func(name string, s State) {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.setLocked(name, s, name+":7946", Meta{NodeID: name}, nil)
		m.fenceLocked()
	}
	set("a", StateAlive)
	set("b", StateAlive)
	set("c", StateAlive)
	set("a", StateDead)
	set("a", StateAlive)
	set("a", StateDead)
	if len(m.order) != 3 {
		t.Fatalf("pending %v, want a, b and c", m.order)
	}
	if ev := *m.pending["a"]; ev.Kind != EventDead || ev.Coalesced != 3 {
		t.Errorf("a: %+v, want dead with 3 coalesced", ev)
	}
	if ev := *m.pending["b"]; ev.Kind != EventJoin || ev.Coalesced != 0 {
		t.Errorf("b: %+v, want join", ev)
	}
	if m.fenced.Load() {
		t.Error("fenced with one of three peers dead")
	}
	set("b", StateDead)
	if !m.fenced.Load() || m.pending["me"] == nil || m.pending["me"].Kind != EventFenced {
		t.Errorf("two of three peers dead: fenced %v, pending %+v", m.fenced.Load(), m.pending["me"])
	}
	set("b", StateLeft)
	if m.fenced.Load() {
		t.Error("fenced with one of two remaining peers dead (b left)")
	}
	if ev := m.pending["me"]; ev == nil || ev.Kind != EventUnfenced || ev.Coalesced != 1 {
		t.Errorf("fence event %+v, want unfenced with 1 coalesced", ev)
	}
}

// With a gossip key, nodes that share it see each other; a node with
// another key is heard by neither, and a key of a wrong size is refused.
func TestGossipKey(t *testing.T) {
	start := func(id string, key []byte, seeds ...string) *Membership {
		t.Helper()
		m, err := New(Config{Meta: Meta{NodeID: id}, BindAddr: "127.0.0.1", Profile: LANProfile(), Seeds: seeds,
			SecretKey: key, Logger: testLogger(t, id)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	k1 := []byte("0123456789abcdef0123456789abcdef")
	k2 := []byte("fedcba9876543210fedcba9876543210")
	a := start("a", k1)
	b := start("b", k1, a.Addr())
	awaitView(t, &node{m: a}, "a sees b", func() bool { return len(a.Members()) == 1 && a.Members()[0].State == StateAlive })
	if got := b.Members(); len(got) != 1 || got[0].Name != "a" {
		t.Fatalf("b's view %+v, want a", got)
	}
	// Join is synchronous: a node with the other key has tried and failed
	// by the time New returns.
	c := start("c", k2, a.Addr())
	if got := c.Members(); len(got) != 0 {
		t.Fatalf("a node with another key joined: %+v", got)
	}
	for _, m := range []*Membership{a, b} {
		for _, p := range m.Members() {
			if p.Name == "c" {
				t.Fatalf("%s hears the node with another key", m.self)
			}
		}
	}
	if _, err := New(Config{Meta: Meta{NodeID: "d"}, BindAddr: "127.0.0.1", SecretKey: []byte("short")}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("a 5-byte key: %v, want ErrBadConfig", err)
	}
}

// A node forgotten by one peer is left in every alive peer's view, and no
// longer counts against their majority; an alive node cannot be forgotten.
func TestForget(t *testing.T) {
	nodes := startCluster(t, 3)
	if err := nodes[0].m.Forget("n1"); !errors.Is(err, ErrNotDead) {
		t.Fatalf("Forget of an alive node: %v, want ErrNotDead", err)
	}
	if err := nodes[2].m.Close(); err != nil { // a crash
		t.Fatal(err)
	}
	for i, nd := range nodes[:2] {
		awaitView(t, nd, fmt.Sprintf("n%d sees n2 dead", i), func() bool { return stateOf(nd, "n2") == StateDead })
	}
	if err := nodes[0].m.Forget("n2"); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(nodes[0], "n2"); s != StateLeft {
		t.Fatalf("n0 holds the forgotten n2 %v", s)
	}
	awaitView(t, nodes[1], "n1 learns that n2 is forgotten", func() bool { return stateOf(nodes[1], "n2") == StateLeft })
	// With n2 left, n1 dying leaves n0 with its only peer dead: fenced.
	// Without the forget it would have been fenced by two dead of two.
	if nodes[0].m.Fenced() {
		t.Fatal("n0 fenced with its only remaining peer alive")
	}
	if err := nodes[0].m.Forget("nobody"); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("Forget of an unknown node: %v, want ErrUnknownNode", err)
	}
}

// A node whose seed is not up yet when it starts joins it once it is: it
// keeps trying while it sees no peer alive.
func TestSeedsRetriedWhileAlone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seed := ln.Addr().(*net.TCPAddr)
	ln.Close()
	b, err := New(Config{Meta: Meta{NodeID: "b"}, BindAddr: "127.0.0.1", Profile: LANProfile(),
		Seeds: []string{seed.String()}, Logger: testLogger(t, "b")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if b.JoinErr() == nil {
		t.Fatal("no join error with the seed down")
	}
	a, err := New(Config{Meta: Meta{NodeID: "a"}, BindAddr: "127.0.0.1", BindPort: seed.Port, Profile: LANProfile(),
		Logger: testLogger(t, "a")})
	if err != nil {
		t.Skipf("the seed's port was taken meanwhile: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	awaitView(t, &node{m: b}, "b joins the seed that came up after it", func() bool { return stateOf(&node{m: b}, "a") == StateAlive })
}

// A forget that reaches a node which still holds the forgotten node alive
// changes nothing there: when that node crashes later it is dead, not
// left.
func TestForgetOfANodeAliveHereIsIgnored(t *testing.T) {
	nodes := startCluster(t, 3)
	var to *memberlist.Node
	for _, n := range nodes[0].m.ml.Members() {
		if n.Name == "n1" {
			to = n
		}
	}
	if err := nodes[0].m.ml.SendReliable(to, append([]byte{msgForget}, "n2"...)); err != nil {
		t.Fatal(err)
	}
	// SendReliable returns once the notice is written to n1's stream; n1
	// handles it within milliseconds, long before n2's crash below could
	// be detected (1.5 s at the earliest).
	awaitView(t, nodes[1], "n1 holds n2 alive", func() bool { return stateOf(nodes[1], "n2") == StateAlive })
	if err := nodes[2].m.Close(); err != nil {
		t.Fatal(err)
	}
	awaitView(t, nodes[1], "n1 sees n2 gone", func() bool { return stateOf(nodes[1], "n2") != StateAlive })
	if s := stateOf(nodes[1], "n2"); s != StateDead {
		t.Fatalf("n2, alive at n1 when the forget came, is %v at n1 after its crash, want dead", s)
	}
}

// A second process started under a live node's id (a copied data
// directory) hears, when it joins, that the id is already announced from
// another address: an id conflict. (The cluster keeps the first.)
func TestIDConflictIsReported(t *testing.T) {
	a, err := New(Config{Meta: Meta{NodeID: "a", ClientAddr: "a:client"}, BindAddr: "127.0.0.1", Profile: LANProfile(), Logger: testLogger(t, "a")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	b, err := New(Config{Meta: Meta{NodeID: "b"}, BindAddr: "127.0.0.1", Profile: LANProfile(), Seeds: []string{a.Addr()},
		Logger: testLogger(t, "b")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	copyOfA, err := New(Config{Meta: Meta{NodeID: "a", ClientAddr: "copy:client"}, BindAddr: "127.0.0.1", Profile: LANProfile(),
		Seeds: []string{b.Addr()}, Logger: testLogger(t, "copy")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = copyOfA.Close() })
	ev := awaitEvent(t, &node{m: copyOfA}, "the copy hears of the process that has its id", func(ev Event) bool { return ev.Kind == EventIDConflict })
	if ev.Node != "a" || ev.Addr != a.Addr() || ev.Meta.ClientAddr != "a:client" {
		t.Fatalf("conflict event %+v, want node a at %s", ev, a.Addr())
	}
	if got := b.Members(); len(got) != 1 || got[0].Addr != a.Addr() {
		t.Fatalf("b's view %+v, want a at its first address", got)
	}
}
