package membership

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// reconnectTargets takes the known peers (SetKnownPeers) under the seeds'
// conditions: while this node sees no peer alive, while it is fenced and
// for a while after start; never its own address, never twice.
func TestReconnectTargetsTakeKnownPeers(t *testing.T) {
	long := time.Now().Add(-time.Hour) // started long ago: past startRejoinFor
	for _, tc := range []struct {
		name    string
		started time.Time
		fenced  bool
		peers   map[string]State
		want    []string
	}{
		{"alone: no peer in the view", long, false, nil, []string{"10.0.0.9:7946", "10.0.0.2:7946", "10.0.0.3:7946"}},
		{"alone: every peer dead", long, false, map[string]State{"10.0.0.2:7946": StateDead, "10.0.0.3:7946": StateDead},
			[]string{"10.0.0.2:7946", "10.0.0.3:7946", "10.0.0.9:7946"}},
		{"fenced", long, true, map[string]State{"10.0.0.2:7946": StateAlive, "10.0.0.3:7946": StateDead, "10.0.0.4:7946": StateDead},
			[]string{"10.0.0.3:7946", "10.0.0.4:7946", "10.0.0.9:7946", "10.0.0.2:7946"}},
		{"just started", time.Now(), false, map[string]State{"10.0.0.2:7946": StateAlive},
			[]string{"10.0.0.9:7946", "10.0.0.2:7946", "10.0.0.3:7946"}},
		{"a peer alive, long after start: the dead only", long, false, map[string]State{"10.0.0.2:7946": StateAlive, "10.0.0.3:7946": StateDead},
			[]string{"10.0.0.3:7946"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Membership{profile: LANProfile(), started: tc.started, table: map[string]*Member{},
				seeds: []string{"10.0.0.9:7946"}, selfAddr: "10.0.0.1:7946"}
			m.fenced.Store(tc.fenced)
			for addr, s := range tc.peers {
				m.table[addr] = &Member{Name: addr, Addr: addr, State: s}
			}
			m.SetKnownPeers([]string{"10.0.0.2:7946", "10.0.0.1:7946", "", "10.0.0.3:7946", "10.0.0.2:7946"})
			got := m.reconnectTargets()
			slices.Sort(got)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("targets %v, want %v", got, want)
			}
		})
	}
}

// SetKnownPeers keeps at most knownPeersMax addresses and starts a round
// only when it brings an address not held before.
func TestSetKnownPeersBoundsAndNudges(t *testing.T) {
	m := &Membership{nudge: make(chan struct{}, 1), table: map[string]*Member{}}
	var many []string
	for i := range knownPeersMax + 10 {
		many = append(many, fmt.Sprintf("10.1.%d.%d:7946", i/256, i%256))
	}
	m.SetKnownPeers(many)
	if len(m.known) != knownPeersMax {
		t.Fatalf("%d known peers kept, want %d", len(m.known), knownPeersMax)
	}
	select {
	case <-m.nudge:
	default:
		t.Fatal("new addresses started no round")
	}
	m.SetKnownPeers(many[:3])
	select {
	case <-m.nudge:
		t.Fatal("addresses already held started a round")
	default:
	}
	m.SetKnownPeers(append(many[:1:1], "10.2.0.1:7946"))
	select {
	case <-m.nudge:
	default:
		t.Fatal("a new address started no round")
	}
}

// A node started without seeds joins the peers it is told of with
// SetKnownPeers: a node that restarts alone finds the cluster its table
// names, and the others see it alive.
func TestKnownPeersJoinedWithoutSeeds(t *testing.T) {
	nodes := startCluster(t, 2)
	c, err := New(Config{Meta: Meta{NodeID: "c", ClientAddr: "c:client", PeerAddr: "c:peer"}, BindAddr: "127.0.0.1",
		Profile: LANProfile(), Logger: testLogger(t, "c")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	cn := &node{m: c}
	if len(c.Members()) != 0 {
		t.Fatalf("a node without seeds sees %+v", c.Members())
	}
	c.SetKnownPeers([]string{c.Addr(), nodes[1].m.Addr()})
	awaitView(t, cn, "c sees both nodes alive", func() bool {
		return stateOf(cn, "n0") == StateAlive && stateOf(cn, "n1") == StateAlive
	})
	for _, nd := range nodes {
		awaitView(t, nd, "the others see c alive", func() bool { return stateOf(nd, "c") == StateAlive })
	}
}
