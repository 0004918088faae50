package raftnet

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/multiraft"
)

// replica is a raft group member over MemoryStorage; the host's loop
// calls Step and Tick, the test proposes, so mu orders them.
type replica struct {
	mu      sync.Mutex
	rn      *raft.RawNode
	st      *raft.MemoryStorage
	send    func([]*raftpb.Message)
	applied []string
}

func (r *replica) Step(m *raftpb.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.rn.Step(*m)
	r.ready()
	return err
}

func (r *replica) Tick() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rn.Tick()
	r.ready()
}

func (r *replica) ready() {
	for r.rn.HasReady() {
		rd := r.rn.Ready()
		if !raft.IsEmptyHardState(rd.HardState) {
			r.st.SetHardState(rd.HardState)
		}
		r.st.Append(rd.Entries)
		if len(rd.Messages) > 0 {
			msgs := make([]*raftpb.Message, len(rd.Messages))
			for i := range rd.Messages {
				msgs[i] = &rd.Messages[i]
			}
			r.send(msgs)
		}
		for _, e := range rd.CommittedEntries {
			if e.Type == raftpb.EntryNormal && len(e.Data) > 0 {
				r.applied = append(r.applied, string(e.Data))
			}
		}
		r.rn.Advance(rd)
	}
}

func (r *replica) propose(data string) (leader bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rn.BasicStatus().RaftState != raft.StateLeader {
		return false
	}
	r.rn.Propose([]byte(data))
	r.ready()
	return true
}

func (r *replica) log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.applied...)
}

// TestRaftGroupsOverTCP runs three multiraft hosts, each with a replica of
// two raft groups, connected only by raftnet on loopback: the groups
// elect leaders and replicate, and keep replicating after every
// connection is cut.
func TestRaftGroupsOverTCP(t *testing.T) {
	const nodes = 3
	groups := []uint64{10, 20}
	voters := []uint64{1, 2, 3}
	lns := make([]net.Listener, nodes)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
	}
	hosts := make([]*multiraft.Host, nodes)
	trs := make([]*Transport, nodes)
	reps := map[uint64][]*replica{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		for _, tr := range trs {
			tr.Close()
		}
	}()
	for i := range nodes {
		id := uint64(i + 1)
		tr := &lateTransport{}
		h, err := multiraft.NewHost(multiraft.Config{NodeID: id, Transport: tr, TickMs: 10})
		if err != nil {
			t.Fatal(err)
		}
		rt, err := New(Config{ClusterID: "c", NodeID: id, Listener: lns[i], Receiver: h, BackoffMinMs: 5, BackoffMaxMs: 50})
		if err != nil {
			t.Fatal(err)
		}
		tr.t = rt
		hosts[i], trs[i] = h, rt
		for _, g := range groups {
			st := raft.NewMemoryStorage()
			if err := st.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{
				Index: 1, Term: 1, ConfState: raftpb.ConfState{Voters: voters},
			}}); err != nil {
				t.Fatal(err)
			}
			rn, err := raft.NewRawNode(&raft.Config{
				ID: id, ElectionTick: 10, HeartbeatTick: 1, Storage: st,
				MaxSizePerMsg: 64 << 10, MaxInflightMsgs: 64, PreVote: true, CheckQuorum: true,
				Logger: &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)},
			})
			if err != nil {
				t.Fatal(err)
			}
			r := &replica{rn: rn, st: st, send: h.Sender(g)}
			reps[g] = append(reps[g], r)
			if err := h.AddGroup(g, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range nodes {
		for j := range nodes {
			if i != j {
				trs[i].AddPeer(uint64(j+1), lns[j].Addr().String())
			}
		}
		wg.Add(1)
		go func(h *multiraft.Host) {
			defer wg.Done()
			h.Run(ctx)
		}(hosts[i])
	}

	next := 0
	// publish proposes n entries to group g through whichever replica
	// leads, retrying until each is applied on all three, bounded by
	// waitMax.
	publish := func(g uint64, n int) {
		t.Helper()
		deadline := time.Now().Add(waitMax)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for range n {
			next++
			data := fmt.Sprintf("g%d-%d", g, next)
			proposed := false
			for !appliedEverywhere(reps[g], data) {
				if time.Now().After(deadline) {
					t.Fatalf("group %d: %q not applied on all replicas within %v; logs %v %v %v",
						g, data, waitMax, reps[g][0].log(), reps[g][1].log(), reps[g][2].log())
				}
				if !proposed || !appliedAnywhere(reps[g], data) {
					for _, r := range reps[g] {
						if r.propose(data) {
							proposed = true
							break
						}
					}
				}
				<-tick.C
			}
		}
	}
	for _, g := range groups {
		publish(g, 5)
	}
	dialsBefore := totalDials(trs)
	for _, tr := range trs {
		tr.CutConnections()
	}
	for _, g := range groups {
		publish(g, 5)
	}
	// Every replica of a group applied the same sequence (a proposal
	// retried after a lost message may appear twice; the order agrees).
	for _, g := range groups {
		want := reps[g][0].log()
		for i, r := range reps[g][1:] {
			got := r.log()
			n := min(len(got), len(want))
			for k := range n {
				if got[k] != want[k] {
					t.Fatalf("group %d: replica %d applied %v, replica 1 %v", g, i+2, got, want)
				}
			}
		}
	}
	if after := totalDials(trs); after <= dialsBefore {
		t.Errorf("%d dials before the cut, %d after: replication went on without reconnecting", dialsBefore, after)
	}
}

func totalDials(trs []*Transport) (n uint64) {
	for _, tr := range trs {
		n += tr.Stats().Dials
	}
	return n
}

func appliedEverywhere(rs []*replica, data string) bool {
	for _, r := range rs {
		if !contains(r.log(), data) {
			return false
		}
	}
	return true
}

func appliedAnywhere(rs []*replica, data string) bool {
	for _, r := range rs {
		if contains(r.log(), data) {
			return true
		}
	}
	return false
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// lateTransport lets the host be built before the raftnet Transport that
// delivers to it.
type lateTransport struct{ t *Transport }

func (l *lateTransport) Send(to uint64, batch []multiraft.Envelope) { l.t.Send(to, batch) }
