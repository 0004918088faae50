package multiraft

import (
	"go.etcd.io/raft/v3/raftpb"

	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func sumStats(s *sim) (groupTicks, sent, beats uint64) {
	for _, id := range s.nodeIDs {
		if n := s.nodes[id]; !n.down {
			st := n.host.Stats()
			groupTicks += st.GroupTicks
			sent += st.Sent
			beats += st.NodeHeartbeats
		}
	}
	return
}

// Idle groups of three go quiet: no group ticks and no raft messages, only
// a node heartbeat per peer every third tick. A proposal wakes its group; a
// crashed leader's groups elect new leaders; a leader that restarts at
// once (inside the liveness window) is not left leading a silent group.
func TestIdleReplicatedGroupsGoQuiet(t *testing.T) {
	s := newSim(t, 11, 3, Faults{DelayMinMs: 1, DelayMaxMs: 3})
	const groups = 60
	for g := uint64(1); g <= groups; g++ {
		s.addGroup(g, []uint64{1, 2, 3})
	}
	rng := rand.New(rand.NewPCG(11, 11))
	for g := uint64(1); g <= groups; g++ {
		s.run(10 * time.Millisecond)
		s.propose(rng, g, fmt.Sprintf("g%d-a", g))
	}
	s.settle(10 * time.Second)
	s.run(30 * tickEvery) // IdleTicks and then some

	ticks0, sent0, beats0 := sumStats(s)
	s.run(20 * tickEvery)
	ticks1, sent1, beats1 := sumStats(s)
	if ticks1 != ticks0 {
		t.Fatalf("idle groups ticked %d times in 20 ticks", ticks1-ticks0)
	}
	// One node heartbeat per peer after every two quiet ticks
	// (PeerLiveTicksDefault/4): 6 or 7 per peer in 20 ticks, by phase.
	if b := beats1 - beats0; b < 3*2*6 || b > 3*2*7 || sent1-sent0 != b {
		t.Fatalf("in 20 idle ticks: %d sent, %d of them node heartbeats (want 36 to 42 and only those)", sent1-sent0, b)
	}

	// A proposal wakes its group and commits everywhere.
	s.nodes[s.leader(7)].reps[7].propose("g7-b")
	s.settle(5 * time.Second)
	for _, id := range s.nodeIDs {
		if v := s.values(id, 7); len(v) == 0 || v[len(v)-1] != "g7-b" {
			t.Fatalf("node %d group 7: %v", id, v)
		}
	}

	// Crash the node leading the most groups: its groups must elect new
	// leaders although they were quiet.
	led := map[uint64]int{}
	for g := uint64(1); g <= groups; g++ {
		led[s.leader(g)]++
	}
	victim := uint64(1)
	for id, n := range led {
		if n > led[victim] {
			victim = id
		}
	}
	s.crash(victim)
	s.run(3 * time.Second)
	for g := uint64(1); g <= groups; g++ {
		if l := s.leader(g); l == 0 || l == victim {
			t.Fatalf("group %d has leader %d after node %d crashed", g, l, victim)
		}
		s.propose(rng, g, fmt.Sprintf("g%d-c", g))
	}
	s.run(time.Second)
	// A restart inside the liveness window: the restarted replicas must
	// not leave any group stuck.
	s.restart(victim)
	cur := s.leader(1)
	s.crash(cur)
	s.run(2 * tickEvery)
	s.restart(cur)
	for g := uint64(1); g <= groups; g++ {
		s.propose(rng, g, fmt.Sprintf("g%d-d", g))
	}
	s.settle(20 * time.Second)
	s.checkLogsAgree()
	for g := uint64(1); g <= groups; g++ {
		want := s.values(1, g)
		for _, id := range s.nodeIDs[1:] {
			if got := s.values(id, g); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("group %d: node %d %v, node 1 %v", g, id, got, want)
			}
		}
	}
}

// A peer is live for PeerLiveTicks host ticks after anything arrives from
// it; every tick the host queues one node heartbeat per known peer.
func TestHostLivenessAndNodeHeartbeats(t *testing.T) {
	tr := &recordTransport{}
	h, _ := NewHost(Config{NodeID: 1, Transport: tr, PeerLiveTicks: 3})
	if err := h.AddGroup(0, &stepGroup{}); err != ErrGroupZero {
		t.Fatalf("AddGroup(0): %v", err)
	}
	if !h.Live(1) || h.Live(2) {
		t.Fatal("self must be live, an unknown peer not")
	}
	h.Deliver(2, []Envelope{{Group: nodeGroup, Msg: msg(2, 1, 0)}})
	if h.Process() != 0 || !h.Live(2) {
		t.Fatal("a node heartbeat is not routed to a group, and makes the peer live")
	}
	for i := range 3 {
		h.Tick()
		if !h.Live(2) {
			t.Fatalf("peer not live %d ticks after it was heard", i+1)
		}
	}
	h.Tick()
	if h.Live(2) {
		t.Fatal("peer still live after PeerLiveTicks")
	}
	h.Flush()
	beats := 0
	for _, s := range tr.sends {
		for _, e := range s.batch {
			if s.to != 2 || e.Group != nodeGroup {
				t.Fatalf("unexpected envelope to %d group %d", s.to, e.Group)
			}
			beats++
		}
	}
	if beats != 4 || h.Stats().NodeHeartbeats != 4 || len(tr.sends) != 1 {
		t.Fatalf("%d heartbeats in %d sends, stats %+v; want 4 in one batch", beats, len(tr.sends), h.Stats())
	}
}

// Three hosts each on their own Run loop (goroutines, the real driver) over
// the Network, pumped by a goroutine, in a synctest bubble: every group of
// three elects a leader and then goes quiet.
func TestHostsRunElectAndQuiesce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := NewNetwork(5, time.Now, Faults{DelayMinMs: 1, DelayMaxMs: 4})
		const groups = 5
		voters := []uint64{1, 2, 3}
		hosts := map[uint64]*Host{}
		reps := map[uint64][]*memReplica{}
		for _, id := range voters {
			h, err := NewHost(Config{NodeID: id, Transport: net.Endpoint(id), TickMs: 10})
			if err != nil {
				t.Fatal(err)
			}
			hosts[id] = h
			net.Attach(id, h)
			for g := uint64(1); g <= groups; g++ {
				r, err := newMemReplica(id, g, 3, bootstrapStorage(voters), h.Sender(g), h.Live, nil)
				if err != nil {
					t.Fatal(err)
				}
				reps[id] = append(reps[id], r)
				h.AddGroup(g, r)
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for _, h := range hosts {
			wg.Go(func() { h.Run(ctx) })
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				time.Sleep(time.Millisecond)
				net.DeliverDue(time.Now())
			}
		})
		// Each read waits for the goroutines that woke at the same instant
		// (host loops mid-flush) to block again, so counters that move
		// together are read together.
		time.Sleep(5 * time.Second)
		synctest.Wait()
		before := hosts[1].Stats()
		time.Sleep(time.Second)
		synctest.Wait()
		after := hosts[1].Stats()
		cancel()
		wg.Wait()
		for g := range groups {
			leaders := 0
			for _, id := range voters {
				if reps[id][g].leader() {
					leaders++
				}
			}
			if leaders != 1 {
				t.Fatalf("group %d has %d leaders", g+1, leaders)
			}
		}
		if after.GroupTicks != before.GroupTicks || after.Sent-before.Sent != after.NodeHeartbeats-before.NodeHeartbeats {
			t.Fatalf("idle second: %d group ticks, %d sent, %d node heartbeats",
				after.GroupTicks-before.GroupTicks, after.Sent-before.Sent, after.NodeHeartbeats-before.NodeHeartbeats)
		}
	})
}

// watchGroup is a quiet group that records the liveness changes the host
// reports and the Live function it was handed.
type watchGroup struct {
	stepGroup
	changes [][]uint64
	live    func(uint64) bool
}

func (g *watchGroup) LivenessChanged(nodes []uint64) {
	g.changes = append(g.changes, append([]uint64(nil), nodes...))
}
func (g *watchGroup) UseLive(live func(uint64) bool) { g.live = live }

// Membership's word (SetPeerDown) makes a peer not live even while its
// messages arrive, and every change of a peer's liveness, from membership
// or from the host's own window, reaches the groups once, at the next tick.
func TestHostReportsLivenessChanges(t *testing.T) {
	h, _ := NewHost(Config{NodeID: 1, Transport: &recordTransport{}, PeerLiveTicks: 3})
	g := &watchGroup{stepGroup: stepGroup{quiet: true}}
	if err := h.AddGroup(5, g); err != nil {
		t.Fatal(err)
	}
	if g.live == nil || !g.live(1) {
		t.Fatal("AddGroup did not hand the group the host's Live")
	}
	beat := func(from uint64) { h.Deliver(from, []Envelope{{Group: nodeGroup, Msg: msg(from, 1, 0)}}) }
	beat(2)
	beat(3)
	h.Tick()
	if len(g.changes) != 1 || len(g.changes[0]) != 2 {
		t.Fatalf("changes %v, want [[2 3]]: two peers became live", g.changes)
	}
	h.Tick()
	if len(g.changes) != 1 {
		t.Fatalf("changes %v: nothing changed at the second tick", g.changes)
	}
	h.SetPeerDown(3, true)
	beat(2)
	beat(3)
	if h.Live(3) || !h.Live(2) {
		t.Fatal("a peer membership reports dead is not live, whatever arrives from it")
	}
	h.Tick()
	if len(g.changes) != 2 || len(g.changes[1]) != 1 || g.changes[1][0] != 3 {
		t.Fatalf("changes %v, want [3] last", g.changes)
	}
	h.SetPeerDown(3, false)
	h.Tick()
	if len(g.changes) != 3 || g.changes[2][0] != 3 || !h.Live(3) {
		t.Fatalf("changes %v, want [3] again when it comes back", g.changes)
	}
	for range 4 { // 2 and 3 fall silent past PeerLiveTicks
		h.Tick()
	}
	if len(g.changes) != 4 || len(g.changes[3]) != 2 {
		t.Fatalf("changes %v, want [2 3] when both fell silent", g.changes)
	}
	if g.ticks != 0 || h.Stats().LivenessChanges != 6 {
		t.Fatalf("a quiet group ticked %d times; stats %+v", g.ticks, h.Stats())
	}
}

// A node heartbeat follows a quarter of PeerLiveTicks of silence toward a
// peer, and none goes to a peer that groups' messages reach more often; the peer that
// receives them stays live throughout.
func TestNodeHeartbeatsOnlyWhereNothingElseWent(t *testing.T) {
	tr := &recordTransport{}
	h, _ := NewHost(Config{NodeID: 1, Transport: tr, PeerLiveTicks: 8})
	recv, _ := NewHost(Config{NodeID: 2, Transport: &recordTransport{}, PeerLiveTicks: 8})
	if err := h.AddGroup(7, &stepGroup{}); err != nil {
		t.Fatal(err)
	}
	h.Deliver(2, []Envelope{{Group: nodeGroup, Msg: msg(2, 1, 0)}})
	h.Deliver(3, []Envelope{{Group: nodeGroup, Msg: msg(3, 1, 0)}})
	send := h.Sender(7)
	beats := map[uint64]int{}
	for tick := 1; tick <= 40; tick++ {
		if tick%2 == 0 {
			send([]*raftpb.Message{msg(1, 3, 0)}) // group 7 talks to node 3 every other tick
		}
		h.Tick()
		recv.Tick()
		h.Flush()
		for _, s := range tr.sends {
			for _, e := range s.batch {
				if e.Group == nodeGroup {
					beats[s.to]++
				}
				if s.to == 2 {
					recv.Deliver(1, []Envelope{e})
				}
			}
		}
		tr.sends = nil
		if !recv.Live(1) {
			t.Fatalf("tick %d: node 1 not live at node 2", tick)
		}
	}
	// Two quiet ticks (8/4) after each: ticks 1, 4, ..., 40 to node 2;
	// node 3 got group 7's messages more often than that, so at most its
	// first tick's heartbeat.
	if beats[2] != 14 || beats[3] > 1 {
		t.Fatalf("node heartbeats %v; want 14 to node 2 and at most 1 to node 3", beats)
	}
}
