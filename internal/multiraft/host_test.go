package multiraft

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recordTransport records every Send.
type recordTransport struct {
	sends []recordedSend
}

type recordedSend struct {
	to    uint64
	batch []Envelope
}

func (r *recordTransport) Send(to uint64, batch []Envelope) {
	r.sends = append(r.sends, recordedSend{to, batch})
}

// stepGroup counts what the host does to it.
type stepGroup struct {
	steps []*raftpb.Message
	ticks int
	quiet bool
	err   error
}

func (g *stepGroup) Step(m *raftpb.Message) error { g.steps = append(g.steps, m); return g.err }
func (g *stepGroup) Tick()                        { g.ticks++ }
func (g *stepGroup) Quiet() bool                  { return g.quiet }

func msg(from, to uint64, typ raftpb.MessageType) *raftpb.Message {
	return &raftpb.Message{From: from, To: to, Type: typ}
}

func TestHostBatchesPerPeerAndRoutesByGroup(t *testing.T) {
	tr := &recordTransport{}
	h, err := NewHost(Config{NodeID: 1, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	groups := map[uint64]*stepGroup{}
	for id := uint64(10); id < 13; id++ {
		groups[id] = &stepGroup{}
		if err := h.AddGroup(id, groups[id]); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.AddGroup(10, &stepGroup{}); !errors.Is(err, ErrGroupExists) {
		t.Fatalf("AddGroup twice: %v, want ErrGroupExists", err)
	}
	// Three groups each send to nodes 2 and 3: one Send per peer node.
	for id := uint64(10); id < 13; id++ {
		h.Sender(id)([]*raftpb.Message{msg(1, 2, raftpb.MsgHeartbeat), msg(1, 3, raftpb.MsgHeartbeat)})
	}
	if n := h.Flush(); n != 6 {
		t.Fatalf("Flush sent %d, want 6", n)
	}
	if len(tr.sends) != 2 || tr.sends[0].to != 2 || tr.sends[1].to != 3 {
		t.Fatalf("sends %+v, want one to node 2 then one to node 3", tr.sends)
	}
	for _, s := range tr.sends {
		if len(s.batch) != 3 {
			t.Fatalf("batch to %d has %d envelopes, want 3", s.to, len(s.batch))
		}
		for i, env := range s.batch {
			if env.Group != uint64(10+i) || env.Msg.To != s.to {
				t.Fatalf("batch to %d envelope %d: group %d to %d", s.to, i, env.Group, env.Msg.To)
			}
		}
	}
	if n := h.Flush(); n != 0 || len(tr.sends) != 2 {
		t.Fatalf("second Flush sent %d", n)
	}

	// Inbound: routed by group id, order kept, unknown groups counted.
	h.Deliver(2, []Envelope{
		{Group: 11, Msg: msg(2, 1, raftpb.MsgApp)},
		{Group: 99, Msg: msg(2, 1, raftpb.MsgApp)},
		{Group: 11, Msg: msg(2, 1, raftpb.MsgHeartbeat)},
		{Group: 12, Msg: msg(2, 1, raftpb.MsgVote)},
		{Group: 12, Msg: nil},
	})
	if n := h.Process(); n != 3 {
		t.Fatalf("Process stepped %d, want 3", n)
	}
	if g := groups[11].steps; len(g) != 2 || g[0].Type != raftpb.MsgApp || g[1].Type != raftpb.MsgHeartbeat {
		t.Fatalf("group 11 got %v", g)
	}
	if len(groups[12].steps) != 1 || len(groups[10].steps) != 0 {
		t.Fatalf("group 12 got %d, group 10 got %d", len(groups[12].steps), len(groups[10].steps))
	}
	st := h.Stats()
	if st.UnknownGroup != 2 || st.Received != 3 || st.Sent != 6 || st.Batches != 2 || st.Groups != 3 {
		t.Fatalf("stats %+v", st)
	}
	// A removed group's messages are counted as unknown.
	if !h.RemoveGroup(11) || h.RemoveGroup(11) {
		t.Fatal("RemoveGroup")
	}
	h.Deliver(2, []Envelope{{Group: 11, Msg: msg(2, 1, raftpb.MsgApp)}})
	h.Process()
	if len(groups[11].steps) != 2 || h.Stats().UnknownGroup != 3 {
		t.Fatalf("removed group stepped: %d, stats %+v", len(groups[11].steps), h.Stats())
	}
}

func TestHostInboxAndOutboxBounded(t *testing.T) {
	tr := &recordTransport{}
	h, err := NewHost(Config{NodeID: 1, Transport: tr, InboxMsgsMax: 4, OutboxMsgsMax: 5})
	if err != nil {
		t.Fatal(err)
	}
	g := &stepGroup{err: errors.New("refused")}
	if err := h.AddGroup(7, g); err != nil {
		t.Fatal(err)
	}
	var batch []Envelope
	for range 10 {
		batch = append(batch, Envelope{Group: 7, Msg: msg(2, 1, raftpb.MsgApp)})
	}
	h.Deliver(2, batch)
	if n := h.Process(); n != 4 {
		t.Fatalf("stepped %d, want the inbox bound 4", n)
	}
	// The inbox is empty again after Process.
	h.Deliver(2, batch[:3])
	if n := h.Process(); n != 3 {
		t.Fatalf("stepped %d after Process, want 3", n)
	}
	var out []*raftpb.Message
	for range 8 {
		out = append(out, msg(1, 2, raftpb.MsgApp))
	}
	h.Sender(7)(out)
	if n := h.Flush(); n != 5 {
		t.Fatalf("flushed %d, want the outbox bound 5", n)
	}
	st := h.Stats()
	if st.InboxDropped != 6 || st.OutboxDropped != 3 || st.StepErrors != 7 {
		t.Fatalf("stats %+v, want 6 inbox drops, 3 outbox drops, 7 step errors", st)
	}
}

// A message a group addresses to its own node goes to its inbox, not the
// transport.
func TestHostLoopsBackToSelf(t *testing.T) {
	tr := &recordTransport{}
	h, _ := NewHost(Config{NodeID: 1, Transport: tr})
	g := &stepGroup{}
	h.AddGroup(3, g)
	h.Sender(3)([]*raftpb.Message{msg(1, 1, raftpb.MsgHeartbeat)})
	if h.Flush() != 0 || h.Process() != 1 || len(g.steps) != 1 {
		t.Fatalf("sends %d, steps %d", len(tr.sends), len(g.steps))
	}
}

// Quiet groups cost a Quiet call per tick and get no Tick; groups of one
// on raft still elect themselves and commit without any tick.
func TestHostQuietGroupsOfOneNeedNoTicks(t *testing.T) {
	s := newSim(t, 1, 1, Faults{})
	const groups = 500
	for g := uint64(1); g <= groups; g++ {
		s.addGroup(g, []uint64{1})
	}
	busy := &stepGroup{}
	s.nodes[1].host.AddGroup(groups+1, busy)
	rng := rand.New(rand.NewPCG(1, 2))
	for g := uint64(1); g <= groups; g++ {
		if !s.propose(rng, g, fmt.Sprintf("v%d", g)) {
			t.Fatalf("group %d refused a proposal", g)
		}
	}
	s.run(100 * tickEvery)
	for g := uint64(1); g <= groups; g++ {
		r := s.nodes[1].reps[g]
		if !r.leader() || len(r.values) != 1 || r.values[0] != fmt.Sprintf("v%d", g) {
			t.Fatalf("group %d: leader %v values %v", g, r.leader(), r.values)
		}
		if r.ticks != 0 {
			t.Fatalf("group %d ticked %d times", g, r.ticks)
		}
	}
	st := s.nodes[1].host.Stats()
	if st.Ticks != 100 || st.QuietSkips != 100*groups || st.GroupTicks != 100 || busy.ticks != 100 {
		t.Fatalf("stats %+v, busy ticks %d", st, busy.ticks)
	}
	if st.Sent != 0 {
		t.Fatalf("groups of one sent %d messages", st.Sent)
	}
}

// Run ticks on its clock and processes what arrives, until its context ends.
func TestHostRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &recordTransport{}
		h, _ := NewHost(Config{NodeID: 1, Transport: tr, TickMs: 10})
		g := &stepGroup{}
		h.AddGroup(5, g)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- h.Run(ctx) }()
		time.Sleep(55 * time.Millisecond) // fake time inside the bubble
		synctest.Wait()
		if g.ticks != 5 {
			t.Fatalf("ticks after 55ms at 10ms: %d, want 5", g.ticks)
		}
		h.Deliver(2, []Envelope{{Group: 5, Msg: msg(2, 1, raftpb.MsgApp)}})
		synctest.Wait()
		if len(g.steps) != 1 {
			t.Fatalf("steps %d, want 1", len(g.steps))
		}
		h.Sender(5)([]*raftpb.Message{msg(1, 2, raftpb.MsgAppResp)})
		synctest.Wait()
		if len(tr.sends) != 1 {
			t.Fatalf("sends %d, want 1", len(tr.sends))
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v", err)
		}
	})
}

func TestNetworkFaultsAreSeededAndFIFO(t *testing.T) {
	run := func(seed uint64) ([]uint64, NetStats) {
		now := time.Unix(0, 0)
		n := NewNetwork(seed, func() time.Time { return now }, Faults{DropPermille: 200, DupPermille: 200, DelayMinMs: 1, DelayMaxMs: 50})
		var got []uint64
		n.Attach(2, receiverFunc(func(from uint64, b []Envelope) {
			for _, e := range b {
				got = append(got, e.Msg.Index)
			}
		}))
		for i := range uint64(200) {
			idx := i
			n.Endpoint(1).Send(2, []Envelope{{Group: 1, Msg: &raftpb.Message{Index: idx}}})
			now = now.Add(time.Millisecond)
			n.DeliverDue(now)
		}
		now = now.Add(time.Second)
		n.DeliverDue(now)
		return got, n.Stats()
	}
	a, sa := run(7)
	b, _ := run(7)
	c, _ := run(8)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("same seed, different deliveries")
	}
	if fmt.Sprint(a) == fmt.Sprint(c) {
		t.Fatal("different seeds, same deliveries")
	}
	if sa.Dropped == 0 || sa.Duplicated == 0 || sa.Delivered != sa.Sent-sa.Dropped+sa.Duplicated {
		t.Fatalf("stats %+v", sa)
	}
	for i := 1; i < len(a); i++ {
		if a[i] < a[i-1] {
			t.Fatalf("without Reorder, %d arrived after %d", a[i], a[i-1])
		}
	}
}

func TestNetworkReorderAndCut(t *testing.T) {
	now := time.Unix(0, 0)
	n := NewNetwork(3, func() time.Time { return now }, Faults{DelayMinMs: 0, DelayMaxMs: 20, Reorder: true})
	var got []uint64
	n.Attach(2, receiverFunc(func(from uint64, b []Envelope) {
		for _, e := range b {
			got = append(got, e.Msg.Index)
		}
	}))
	n.Attach(1, receiverFunc(func(uint64, []Envelope) { t.Fatal("delivery over a cut link") }))
	for i := range uint64(100) {
		idx := i
		n.Endpoint(1).Send(2, []Envelope{{Msg: &raftpb.Message{Index: idx}}})
	}
	n.DeliverDue(now.Add(time.Second))
	reordered := false
	for i := 1; i < len(got); i++ {
		reordered = reordered || got[i] < got[i-1]
	}
	if len(got) != 100 || !reordered {
		t.Fatalf("got %d envelopes, reordered %v", len(got), reordered)
	}
	// A cut drops what is sent and what is already in flight.
	idx := uint64(1)
	n.Endpoint(1).Send(2, []Envelope{{Msg: &raftpb.Message{Index: idx}}})
	n.Split([]uint64{1}, []uint64{2})
	n.Endpoint(2).Send(1, []Envelope{{Msg: &raftpb.Message{Index: idx}}})
	n.DeliverDue(now.Add(2 * time.Second))
	if st := n.Stats(); st.Cut != 2 || len(got) != 100 {
		t.Fatalf("stats %+v, got %d", st, len(got))
	}
	n.Heal()
	n.Endpoint(1).Send(2, []Envelope{{Msg: &raftpb.Message{Index: idx}}})
	n.DeliverDue(now.Add(3 * time.Second))
	if len(got) != 101 {
		t.Fatalf("after Heal got %d, want 101", len(got))
	}
}

type receiverFunc func(from uint64, batch []Envelope)

func (f receiverFunc) Deliver(from uint64, batch []Envelope) { f(from, batch) }

// Three nodes, several groups of three: every group elects a leader and
// replicates on a perfect network, with one Send per peer per flush.
func TestReplicatedGroupsElectAndReplicate(t *testing.T) {
	s := newSim(t, 1, 3, Faults{DelayMinMs: 1, DelayMaxMs: 3})
	for g := uint64(1); g <= 8; g++ {
		s.addGroup(g, []uint64{1, 2, 3})
	}
	s.run(2 * time.Second)
	rng := rand.New(rand.NewPCG(5, 5))
	for i := range 50 {
		for g := uint64(1); g <= 8; g++ {
			s.propose(rng, g, fmt.Sprintf("g%d-%d", g, i))
		}
		s.run(20 * time.Millisecond)
	}
	s.settle(10 * time.Second)
	for g := uint64(1); g <= 8; g++ {
		want := s.values(1, g)
		if len(want) != 50 {
			t.Fatalf("group %d applied %d values, want 50", g, len(want))
		}
		for _, n := range []uint64{2, 3} {
			if got := s.values(n, g); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("group %d node %d applied %v, node 1 %v", g, n, got, want)
			}
		}
	}
	s.checkLogsAgree()
	st := s.nodes[1].host.Stats()
	if st.Batches == 0 || st.Sent < 2*st.Batches {
		t.Fatalf("host 1 stats %+v: expected batches carrying several groups", st)
	}
}

// A leader cut off from its group is replaced; the old leader's proposals
// made while isolated are never committed; after the heal every replica
// agrees.
func TestPartitionedLeaderIsReplacedAndHeals(t *testing.T) {
	s := newSim(t, 2, 3, Faults{DelayMinMs: 1, DelayMaxMs: 3})
	s.addGroup(1, []uint64{1, 2, 3})
	s.run(2 * time.Second)
	old := s.leader(1)
	if old == 0 {
		t.Fatal("no leader")
	}
	var others []uint64
	for _, id := range s.nodeIDs {
		if id != old {
			others = append(others, id)
		}
	}
	s.net.Isolate(old, s.nodeIDs)
	// Proposed on the isolated leader: it cannot commit them.
	for i := range 5 {
		s.nodes[old].reps[1].propose(fmt.Sprintf("lost-%d", i))
	}
	s.run(3 * time.Second)
	nl := s.leader(1)
	if nl == 0 || nl == old {
		t.Fatalf("leader after isolating %d: %d", old, nl)
	}
	if s.nodes[old].reps[1].leader() {
		t.Fatalf("isolated node %d still leads (CheckQuorum should depose it)", old)
	}
	for i := range 5 {
		s.nodes[nl].reps[1].propose(fmt.Sprintf("kept-%d", i))
	}
	s.run(time.Second)
	s.settle(10 * time.Second)
	for _, id := range s.nodeIDs {
		got := s.values(id, 1)
		if fmt.Sprint(got) != "[kept-0 kept-1 kept-2 kept-3 kept-4]" {
			t.Fatalf("node %d applied %v", id, got)
		}
	}
	s.checkLogsAgree()
	_ = others
}

// seeds returns the seeds a randomised test runs: MULTIRAFT_SEED picks one
// (to replay a failure), MULTIRAFT_SEEDS sets how many, else n seeds from 1
// (a fifth of them with -short).
func seeds(t *testing.T, n int) []uint64 {
	if v := os.Getenv("MULTIRAFT_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return []uint64{s}
	}
	if v := os.Getenv("MULTIRAFT_SEEDS"); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k < 1 {
			t.Fatalf("MULTIRAFT_SEEDS=%q", v)
		}
		n = k
	} else if testing.Short() {
		n = max(n/5, 1)
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

// Randomised runs: 3 nodes, groups of three and of one, on a network that
// drops, duplicates, delays and reorders, with random partitions, heals
// and node crashes (restart from storage). The checker fails the run if
// any replica applies a committed entry out of order, skips one, or
// applies at an index something other than the others applied there, and
// at the end every replica must hold the group's whole history.
func TestRandomizedFaults(t *testing.T) {
	for _, seed := range seeds(t, 20) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { randomizedRun(t, seed) })
	}
}

func randomizedRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	f := Faults{
		DropPermille: rng.IntN(200),
		DupPermille:  rng.IntN(100),
		DelayMinMs:   rng.IntN(3),
		DelayMaxMs:   3 + rng.IntN(40),
		Reorder:      rng.IntN(2) == 0,
	}
	s := newSim(t, seed, 3, f)
	all := []uint64{1, 2, 3}
	for g := uint64(1); g <= 4; g++ {
		s.addGroup(g, all)
	}
	s.addGroup(5, []uint64{uint64(1 + rng.IntN(3))}) // a group of one beside them
	proposed := 0
	for step := range 300 {
		switch r := rng.IntN(100); {
		case r < 60:
			g := uint64(1 + rng.IntN(5))
			if s.propose(rng, g, fmt.Sprintf("s%d-g%d-%d", seed, g, step)) {
				proposed++
			}
		case r < 66:
			a := uint64(1 + rng.IntN(3))
			s.net.Isolate(a, all)
		case r < 70:
			a, b := uint64(1+rng.IntN(3)), uint64(1+rng.IntN(3))
			if a != b {
				s.net.CutOneWay(a, b)
			}
		case r < 80:
			s.net.Heal()
		case r < 84:
			// Crash one node at a time, so a quorum of each group can remain.
			down := 0
			for _, id := range all {
				if s.nodes[id].down {
					down++
				}
			}
			if id := uint64(1 + rng.IntN(3)); down == 0 {
				s.crash(id)
			}
		case r < 90:
			for _, id := range all {
				if s.nodes[id].down {
					s.restart(id)
				}
			}
		}
		s.run(time.Duration(5+rng.IntN(60)) * time.Millisecond)
	}
	s.settle(30 * time.Second)
	s.checkLogsAgree()
	committed := 0
	for _, g := range s.groups {
		want := s.values(g.voters[0], g.id)
		committed += len(want)
		for _, v := range g.voters[1:] {
			if got := s.values(v, g.id); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("seed %d group %d: node %d applied %d values, node %d %d", seed, g.id, v, len(got), g.voters[0], len(want))
			}
		}
	}
	if committed == 0 {
		t.Fatalf("seed %d: nothing committed of %d proposals", seed, proposed)
	}
	t.Logf("seed %d faults %+v: %d proposals taken, %d committed values; net %+v", seed, f, proposed, committed, s.net.Stats())
}
