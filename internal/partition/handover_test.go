package partition

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/multiraft"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/internal/wal"
)

// The tests in this file stop a node that leads several partitions: three
// nodes, each with one multiraft.Host and one journal, hold a replica of
// every one of groups partitions (a synctest bubble, an in-process network,
// simulated time, as in replica_test.go).

const mgroupFirstID = 100 // the raft group id of partition 0

// mnode is one node: its host, its journal and its replica of each group.
type mnode struct {
	id    uint64
	fs    *vfs.MemFS
	host  *multiraft.Host
	wal   *wal.WAL
	parts []*Partition
}

// mgroup is three nodes holding replicas of the same groups.
type mgroup struct {
	t        testing.TB
	net      *multiraft.Network
	nodes    [4]*mnode // by raft id 1..3
	nextTick time.Time
}

// newMGroup opens groups partitions on three nodes; campaign(i) names the
// node whose replica of group i campaigns at once (it leads it first).
func newMGroup(t testing.TB, seed uint64, groups int, campaign func(i int) uint64, mod func(*Config)) *mgroup {
	g := &mgroup{t: t, net: multiraft.NewNetwork(seed, time.Now, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 5})}
	g.nextTick = time.Now().Add(replTick)
	for id := uint64(1); id <= 3; id++ {
		n := &mnode{id: id, fs: vfs.NewMem()}
		h, err := multiraft.NewHost(multiraft.Config{NodeID: id, Transport: g.net.Endpoint(id)})
		if err != nil {
			t.Fatal(err)
		}
		w, err := wal.Open(wal.Options{FS: n.fs, Dir: "wal"})
		if err != nil {
			t.Fatal(err)
		}
		n.host, n.wal = h, w
		for i := range groups {
			cfg := testConfig(n.fs)
			cfg.Dir = fmt.Sprintf("data/p%d", i)
			cfg.Index = uint32(i)
			cfg.RaftID, cfg.RaftPeers = id, []uint64{1, 2, 3}
			cfg.Queue.LeaseMs = 3_600_000
			cfg.Send = h.Sender(mgroupFirstID + uint64(i))
			cfg.WAL, cfg.WALGroup = w, fmt.Sprintf("queues/t/g/p%d", i)
			cfg.CampaignAtStart = campaign(i) == id
			if mod != nil {
				mod(&cfg)
			}
			p, err := Open(cfg)
			if err != nil {
				t.Fatalf("open replica %d of group %d: %v", id, i, err)
			}
			if err := h.AddGroup(mgroupFirstID+uint64(i), p); err != nil {
				t.Fatal(err)
			}
			n.parts = append(n.parts, p)
		}
		g.net.Attach(id, h)
		g.nodes[id] = n
	}
	return g
}

func (g *mgroup) close() {
	for _, n := range g.nodes[1:] {
		for _, p := range n.parts {
			_ = p.Close()
		}
		_ = n.wal.Close()
	}
}

// run advances simulated time by d, delivering envelopes when due and
// ticking every host each replTick (replica_test.go's rgroup.run).
func (g *mgroup) run(d time.Duration) {
	end := time.Now().Add(d)
	for {
		for range replPumpMax {
			synctest.Wait()
			work := g.net.DeliverDue(time.Now())
			for _, n := range g.nodes[1:] {
				work += n.host.Process() + n.host.Flush()
			}
			if work == 0 {
				synctest.Wait()
				break
			}
		}
		now := time.Now()
		if !now.Before(end) {
			return
		}
		next := g.nextTick
		if due, ok := g.net.NextDue(); ok && due.Before(next) {
			next = due
		}
		if next.After(end) {
			next = end
		}
		if next.After(now) {
			time.Sleep(next.Sub(now))
		}
		if !time.Now().Before(g.nextTick) {
			g.nextTick = g.nextTick.Add(replTick)
			for _, n := range g.nodes[1:] {
				n.host.Tick()
			}
		}
	}
}

// leaderOf is the raft id every replica of group i names as its leader (0
// while they do not agree).
func (g *mgroup) leaderOf(i int) uint64 {
	lead, _ := g.nodes[1].parts[i].Leader()
	for _, n := range g.nodes[2:] {
		if l, _ := n.parts[i].Leader(); l != lead {
			return 0
		}
	}
	return lead
}

// awaitLeaders runs until every group has a leader its replicas agree on
// (bounded in simulated time) and returns them.
func (g *mgroup) awaitLeaders() []uint64 {
	g.t.Helper()
	for range 500 {
		var out []uint64
		for i := range g.nodes[1].parts {
			if l := g.leaderOf(i); l != 0 {
				out = append(out, l)
			}
		}
		if len(out) == len(g.nodes[1].parts) {
			return out
		}
		g.run(replTick)
	}
	g.t.Fatal("not every group has a leader after 5s of simulated time")
	return nil
}

// publish publishes body to group i through node id's replica and waits
// for the answer (bounded in simulated time).
func (g *mgroup) publish(id uint64, i int, body string) error {
	g.t.Helper()
	ch := make(chan error, 1)
	g.nodes[id].parts[i].Publish(&queue.Message{Body: []byte(body)}, func(_ uint64, err error) { ch <- err })
	for range 200 {
		select {
		case err := <-ch:
			return err
		default:
		}
		g.run(replTick)
	}
	g.t.Fatalf("publish %s to group %d on %d: no answer in 2s of simulated time", body, i, id)
	return nil
}

// handOver runs HandOver for node id's replicas, bounded by bound of
// simulated time, while the nodes run; it returns the report.
func (g *mgroup) handOver(id uint64, want func(i int) []uint64, bound time.Duration) HandoverReport {
	g.t.Helper()
	var hs []Handover
	for i, p := range g.nodes[id].parts {
		hs = append(hs, Handover{P: p, Want: want(i)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	done := make(chan HandoverReport, 1)
	go func() { done <- HandOver(ctx, hs, "test", 2*replTick) }()
	for range int(bound/replTick) + 10 {
		select {
		case rep := <-done:
			return rep
		default:
		}
		g.run(replTick)
	}
	g.t.Fatalf("HandOver did not return within its bound (%v of simulated time) and 10 ticks", bound)
	return HandoverReport{}
}

// A node that stops hands the lead of every group it leads to a caught-up
// voter, the first its placement names: each group is then led by that
// voter, through a transfer (no election), with every confirmed publish
// there; a group it did not lead keeps its leader. Afterwards its replicas
// take no lead back: the new leader's transfer to the stopping node, its
// preferred owner, is refused and abandoned, and the group serves on.
func TestHandOverEveryLedGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const groups = 4
		const hold = 30 // raft ticks: the preferred owner's hold-down
		// Node 1 leads groups 0 to 2, node 2 group 3.
		g := newMGroup(t, 41, groups, func(i int) uint64 { return map[bool]uint64{true: 1, false: 2}[i < 3] },
			func(c *Config) { c.PreferredOwnerHoldTicks = hold })
		defer g.close()
		leaders := g.awaitLeaders()
		if fmt.Sprint(leaders) != "[1 1 1 2]" {
			t.Fatalf("leaders %v at start, want [1 1 1 2]", leaders)
		}
		for i := range groups {
			for k := range 5 {
				if err := g.publish(leaders[i], i, fmt.Sprintf("g%d-m%d", i, k)); err != nil {
					t.Fatalf("publish to group %d: %v", i, err)
				}
			}
		}
		g.run(3 * replTick) // the leaders note their caught-up voters at their ticks
		// The placement prefers node 1, then 3, then 2: the lead goes to 3.
		want := func(int) []uint64 { return []uint64{1, 3, 2} }
		rep := g.handOver(1, want, 2*time.Second)
		if rep.Led != 3 || rep.HandedOver != 3 || rep.Elected != 0 || rep.Left != 0 || rep.NewLeaders[3] != 3 || rep.Err != nil {
			t.Fatalf("report %+v, want 3 groups led and all 3 handed over to node 3", rep)
		}
		for i := range groups {
			wantLead := uint64(3)
			if i == 3 {
				wantLead = 2
			}
			if l := g.leaderOf(i); l != wantLead {
				t.Fatalf("group %d led by %d after the handover, want %d", i, l, wantLead)
			}
			got := unsettled(t, g.nodes[wantLead].parts[i])
			for k := range 5 {
				body := fmt.Sprintf("g%d-m%d", i, k)
				found := false
				for _, b := range got {
					found = found || b == body
				}
				if !found {
					t.Fatalf("group %d: confirmed %s not on its new leader %d (holds %v)", i, body, wantLead, got)
				}
			}
		}
		// The new leader of group 0 hands the lead to its preferred owner,
		// node 1, once the hold-down has passed: node 1 refuses it.
		transfer := ""
		for k := 0; k < hold+40 && transfer == ""; k++ {
			ctx, cancel := context.WithTimeout(context.Background(), inspectWaitMax)
			what, err := g.nodes[3].parts[0].Reconfigure(ctx, want(0))
			cancel()
			if err != nil {
				t.Fatalf("Reconfigure on the new leader: %v", err)
			}
			transfer = what
			g.run(replTick)
		}
		if !strings.HasPrefix(transfer, "transfer leadership to 1") {
			t.Fatalf("the new leader's step: %q, want a transfer to the preferred owner 1", transfer)
		}
		for k := range 4 * raftElectionTicks {
			for i := range groups {
				if l, _ := g.nodes[1].parts[i].Leader(); l == 1 {
					t.Fatalf("tick %d: the stopping node leads group %d again", k, i)
				}
			}
			g.run(replTick)
		}
		if l := g.leaderOf(0); l != 3 {
			t.Fatalf("group 0 led by %d after the refused transfer, want 3", l)
		}
		if err := g.publish(3, 0, "after"); err != nil {
			t.Fatalf("publish after the refused transfer: %v", err)
		}
	})
}

// The handover is bounded: when no voter can take the lead (the stopping
// node is cut off from the others) HandOver returns once its time is up,
// every group left to the normal election, which the others then hold
// among themselves: the stopping node never leads again.
func TestHandOverIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newMGroup(t, 42, 2, func(int) uint64 { return 1 }, nil)
		defer g.close()
		if l := g.awaitLeaders(); fmt.Sprint(l) != "[1 1]" {
			t.Fatalf("leaders %v at start, want [1 1]", l)
		}
		g.run(3 * replTick)
		g.net.Isolate(1, []uint64{2, 3})
		rep := g.handOver(1, func(int) []uint64 { return []uint64{1, 2, 3} }, time.Second)
		if rep.Led != 2 || rep.HandedOver != 0 || rep.Elected != 0 || rep.Left != 2 {
			t.Fatalf("report %+v, want 2 led, both left to the election", rep)
		}
		g.net.Heal()
		leaders := g.awaitLeaders()
		for i, l := range leaders {
			if l == 1 {
				t.Fatalf("group %d led by the stopping node after the cut healed", i)
			}
		}
		for k := range 4 * raftElectionTicks {
			for i := range leaders {
				if l, _ := g.nodes[1].parts[i].Leader(); l == 1 {
					t.Fatalf("tick %d: the stopping node leads group %d again", k, i)
				}
			}
			g.run(replTick)
		}
	})
}
