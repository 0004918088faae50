package multiraft

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
)

// tickEvery is the simulated time between two host ticks.
const tickEvery = 10 * time.Millisecond

// sim is a cluster of hosts on one Network, all driven from the test
// goroutine with simulated time: no goroutine, so a run is decided by the
// Network's seed and the test's own random choices (except raft's election
// jitter, which etcd raft v3.6.0 draws from crypto/rand).
type sim struct {
	t        testing.TB
	seed     uint64
	now      time.Time
	nextTick time.Time
	net      *Network
	nodeIDs  []uint64
	nodes    map[uint64]*simNode
	groups   []simGroup
	hist     map[uint64]*history
	failed   bool
	// noQuiesce keeps every replicated group ticking (benchmarks compare).
	noQuiesce bool
}

type simGroup struct {
	id     uint64
	voters []uint64
}

type simNode struct {
	id       uint64
	host     *Host
	down     bool
	reps     map[uint64]*memReplica
	storages map[uint64]*raft.MemoryStorage // what survives a crash
}

func newSim(t testing.TB, seed uint64, nodes int, f Faults) *sim {
	s := &sim{
		t:     t,
		seed:  seed,
		now:   time.Unix(1_800_000_000, 0),
		nodes: make(map[uint64]*simNode),
		hist:  make(map[uint64]*history),
	}
	s.nextTick = s.now.Add(tickEvery)
	s.net = NewNetwork(seed, func() time.Time { return s.now }, f)
	for i := 1; i <= nodes; i++ {
		id := uint64(i)
		s.nodeIDs = append(s.nodeIDs, id)
		n := &simNode{id: id, reps: make(map[uint64]*memReplica), storages: make(map[uint64]*raft.MemoryStorage)}
		s.nodes[id] = n
		s.startHost(n)
	}
	return s
}

func (s *sim) fail(format string, args ...any) {
	s.failed = true
	s.t.Fatalf("seed %d: %s", s.seed, fmt.Sprintf(format, args...))
}

func (s *sim) startHost(n *simNode) {
	h, err := NewHost(Config{NodeID: n.id, Transport: s.net.Endpoint(n.id)})
	if err != nil {
		s.t.Fatal(err)
	}
	n.host = h
	n.down = false
	s.net.Attach(n.id, h)
}

// addGroup creates group id with a replica on each of voters.
func (s *sim) addGroup(id uint64, voters []uint64) {
	s.groups = append(s.groups, simGroup{id: id, voters: voters})
	s.hist[id] = newHistory(id, s.fail)
	for _, v := range voters {
		n := s.nodes[v]
		n.storages[id] = bootstrapStorage(voters)
		s.startReplica(n, id, len(voters))
	}
}

func (s *sim) startReplica(n *simNode, group uint64, voters int) {
	r, err := newMemReplica(n.id, group, voters, n.storages[group], n.host.Sender(group), n.host.Live, s.hist[group])
	if err != nil {
		s.t.Fatal(err)
	}
	if s.noQuiesce {
		r.quiesce.IdleTicks = 1 << 30
	}
	n.reps[group] = r
	if err := n.host.AddGroup(group, r); err != nil {
		s.t.Fatal(err)
	}
}

// crash stops node id: its host and replicas are gone, envelopes to it are
// lost, and only its storages (everything persisted before a send) remain.
func (s *sim) crash(id uint64) {
	n := s.nodes[id]
	n.down = true
	n.host = nil
	clear(n.reps)
	s.net.Detach(id)
}

// restart brings node id back from its storages.
func (s *sim) restart(id uint64) {
	n := s.nodes[id]
	s.startHost(n)
	for _, g := range s.groups {
		if _, ok := n.storages[g.id]; ok {
			s.startReplica(n, g.id, len(g.voters))
		}
	}
}

// run advances simulated time by d, delivering envelopes when they are
// due and ticking every host each tickEvery.
func (s *sim) run(d time.Duration) {
	end := s.now.Add(d)
	for {
		next := s.nextTick
		if due, ok := s.net.NextDue(); ok && due.Before(next) {
			next = due
		}
		if next.After(end) {
			s.now = end
			return
		}
		s.now = next
		s.net.DeliverDue(s.now)
		tick := !s.now.Before(s.nextTick)
		if tick {
			s.nextTick = s.nextTick.Add(tickEvery)
		}
		for _, id := range s.nodeIDs {
			n := s.nodes[id]
			if n.down {
				continue
			}
			if tick {
				n.host.Tick()
			}
			for range 100 {
				if n.host.Process()+n.host.Flush() == 0 {
					break
				}
			}
		}
	}
}

// leader returns the node that leads group g, or 0. Two leaders at once
// in different terms can exist briefly; the highest term wins here.
func (s *sim) leader(g uint64) uint64 {
	var id, term uint64
	for _, nid := range s.nodeIDs {
		n := s.nodes[nid]
		if n.down {
			continue
		}
		r, ok := n.reps[g]
		if !ok {
			continue
		}
		st := r.rn.BasicStatus()
		if st.RaftState == raft.StateLeader && st.HardState.Term > term {
			id, term = nid, st.HardState.Term
		}
	}
	return id
}

// propose offers v to group g at a random live replica (a follower
// forwards it to its leader). It reports whether raft took it; taken is
// not committed.
func (s *sim) propose(rng *rand.Rand, g uint64, v string) bool {
	var live []*memReplica
	for _, nid := range s.nodeIDs {
		if n := s.nodes[nid]; !n.down {
			if r, ok := n.reps[g]; ok {
				live = append(live, r)
			}
		}
	}
	if len(live) == 0 {
		return false
	}
	return live[rng.IntN(len(live))].propose(v) == nil
}

// checkLogsAgree checks raft's Log Matching on the storages: for every
// pair of replicas of a group, entries up to the lower of their commit
// indexes have the same term and data.
func (s *sim) checkLogsAgree() {
	for _, g := range s.groups {
		type view struct {
			node   uint64
			st     *raft.MemoryStorage
			commit uint64
		}
		var vs []view
		for _, v := range g.voters {
			st := s.nodes[v].storages[g.id]
			hs, _, _ := st.InitialState()
			vs = append(vs, view{v, st, hs.Commit})
		}
		for i := range vs {
			for j := i + 1; j < len(vs); j++ {
				hi := min(vs[i].commit, vs[j].commit)
				if hi < 2 {
					continue
				}
				a, err1 := vs[i].st.Entries(2, hi+1, 1<<62)
				b, err2 := vs[j].st.Entries(2, hi+1, 1<<62)
				if err1 != nil || err2 != nil {
					s.fail("group %d: entries 2..%d: %v %v", g.id, hi, err1, err2)
				}
				for k := range a {
					if a[k].Term != b[k].Term || string(a[k].Data) != string(b[k].Data) {
						s.fail("group %d: nodes %d and %d disagree at committed index %d", g.id, vs[i].node, vs[j].node, a[k].Index)
					}
				}
			}
		}
	}
}

// settle heals the network, removes faults, restarts crashed nodes and
// runs until every group has a leader and every replica has applied the
// group's whole history, or fails after limit.
func (s *sim) settle(limit time.Duration) {
	s.net.Heal()
	s.net.SetFaults(Faults{})
	for _, id := range s.nodeIDs {
		if s.nodes[id].down {
			s.restart(id)
		}
	}
	deadline := s.now.Add(limit)
	for s.now.Before(deadline) {
		s.run(50 * time.Millisecond)
		if s.settled() {
			return
		}
	}
	for _, g := range s.groups {
		var applied []uint64
		for _, v := range g.voters {
			applied = append(applied, s.nodes[v].reps[g.id].applied)
		}
		s.t.Logf("group %d: leader %d, history %d, applied %v", g.id, s.leader(g.id), s.hist[g.id].last, applied)
	}
	s.fail("not settled within %v", limit)
}

func (s *sim) settled() bool {
	for _, g := range s.groups {
		if s.leader(g.id) == 0 {
			return false
		}
		for _, v := range g.voters {
			if s.nodes[v].reps[g.id].applied != s.hist[g.id].last {
				return false
			}
		}
	}
	return true
}

// values returns what replica node applied in group g.
func (s *sim) values(node, g uint64) []string {
	return slices.Clone(s.nodes[node].reps[g].values)
}
