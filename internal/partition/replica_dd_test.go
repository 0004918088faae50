package partition

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/cockroachdb/datadriven"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/multiraft"
	"github.com/sinewmq/sinew/internal/queue"
)

// TestReplicaDataDriven runs the scenarios in testdata/replica against a
// three-replica group of real partitions (the rgroup of replica_test.go) on
// a fault-free in-process network, inside a synctest bubble.
//
// The scenarios must print the same thing on every run, and etcd raft
// draws its randomised election timeouts from a source no test can seed.
// So nothing here lets a timeout elect anyone: simulated time never moves
// (stabilize only exchanges what is due now), ticks are given only when a
// scenario asks for them, and leaders are made with campaign. A scenario
// ticks followers only while they hear from a leader, or ticks a leader
// alone (its check-quorum step down is not randomised).
//
// Commands (node ids are 1..3):
//
//	group [ckpt-every=N] [segment-bytes=N]   start the group (once, first)
//	campaign node=N [force]   N campaigns: with pre-vote, or, with force, as
//	                          a leadership transfer makes it (no pre-vote, and
//	                          voters ignore their current leader's lease)
//	tick [n=1] [node=N]       n raft ticks to every up replica (or to N alone),
//	                          exchanging messages after each
//	stabilize                 exchange messages until nothing moves
//	cut A B / isolate node=N / heal   network partitions
//	crash node=N              power loss on N's crashable MemFS: only synced
//	                          bytes are sure to survive (unsynced tails are
//	                          torn by the group's seeded rng)
//	restart node=N            reopen N from its disk
//	publish node=N body=B [size=S]  publish (B padded with '-' to S bytes);
//	                          prints the outcome once it is known
//	consume node=N n=K        give N's consumer K more credit; prints deliveries
//	ack node=N offset=O       ack the consumer's latest lease on O
//	status                    per replica: raft role, term, leader, commit,
//	                          applied, the index its checkpoint covers up to
//	                          (exclusive), log first..last with the terms
//	messages node=N           N's unsettled messages: offset, state, body
//
// Every command ends by printing the client requests answered during it,
// and "pending" for a request it made that is not answered yet.
func TestReplicaDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/replica", func(t *testing.T, path string) {
		synctest.Test(t, func(t *testing.T) {
			var h *ddGroup
			defer func() {
				if h != nil {
					h.g.closeAll()
				}
			}()
			datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
				if td.Cmd == "group" {
					if h != nil {
						td.Fatalf(t, "one group per file")
					}
					h = newDDGroup(t, td)
					return "ok\n"
				}
				if h == nil {
					td.Fatalf(t, "no group yet")
				}
				h.t = t
				var b strings.Builder
				h.run(td, &b)
				h.answered(&b)
				if b.Len() == 0 {
					return "ok\n"
				}
				return b.String()
			})
		})
	})
}

// ddGroup is the scenario's group and what its clients are waiting for.
type ddGroup struct {
	t    *testing.T
	g    *rgroup
	ops  []*ddOp
	cons [4]*ddConsumer // by node
}

// ddOp is a client request whose answer is printed once it comes.
type ddOp struct {
	what string
	pub  chan pubResult
	set  chan error
	told bool // "pending" was printed
}

// ddConsumer is one replica's consumer and how many of its deliveries
// were printed.
type ddConsumer struct {
	c    *tconsumer
	p    *Partition
	seen int
}

func newDDGroup(t *testing.T, td *datadriven.TestData) *ddGroup {
	ckptEvery, segBytes := 0, int64(0)
	td.MaybeScanArgs(t, "ckpt-every", &ckptEvery)
	td.MaybeScanArgs(t, "segment-bytes", &segBytes)
	g := newRGroup(t, 1, multiraft.Faults{}, func(c *Config) {
		if ckptEvery > 0 {
			c.CheckpointEveryRecords = ckptEvery
		}
		if segBytes > 0 {
			c.SegmentBytes = segBytes
		}
	})
	return &ddGroup{t: t, g: g}
}

func (h *ddGroup) node(td *datadriven.TestData) *rnode {
	var id uint64
	td.ScanArgs(h.t, "node", &id)
	if id < 1 || id > 3 {
		td.Fatalf(h.t, "node %d: want 1..3", id)
	}
	return h.g.nodes[id]
}

func (h *ddGroup) upNode(td *datadriven.TestData) *rnode {
	n := h.node(td)
	if n.down {
		td.Fatalf(h.t, "node %d is down", n.id)
	}
	return n
}

func (h *ddGroup) run(td *datadriven.TestData, b *strings.Builder) {
	g := h.g
	switch td.Cmd {
	case "stabilize":
		g.pump()
	case "tick":
		n := 1
		td.MaybeScanArgs(h.t, "n", &n)
		nodes := g.up()
		if td.HasArg("node") {
			nodes = []*rnode{h.upNode(td)}
		}
		for range n {
			for _, x := range nodes {
				x.host.Tick()
			}
			g.pump()
		}
	case "campaign":
		h.campaign(td, h.upNode(td), td.HasArg("force"))
		g.pump()
	case "cut":
		if len(td.CmdArgs) != 2 {
			td.Fatalf(h.t, "cut A B")
		}
		a, err1 := strconv.ParseUint(td.CmdArgs[0].Key, 10, 64)
		c, err2 := strconv.ParseUint(td.CmdArgs[1].Key, 10, 64)
		if err1 != nil || err2 != nil {
			td.Fatalf(h.t, "cut A B: node ids")
		}
		g.net.Cut(a, c)
	case "isolate":
		n := h.node(td)
		var others []uint64
		for id := uint64(1); id <= 3; id++ {
			if id != n.id {
				others = append(others, id)
			}
		}
		g.net.Isolate(n.id, others)
	case "heal":
		g.net.Heal()
	case "crash":
		n := h.upNode(td)
		h.cons[n.id] = nil
		g.crash(n.id)
	case "restart":
		n := h.node(td)
		if !n.down {
			td.Fatalf(h.t, "node %d is up", n.id)
		}
		g.restart(n.id)
		g.pump()
	case "publish":
		n := h.upNode(td)
		var body string
		td.ScanArgs(h.t, "body", &body)
		size := 0
		td.MaybeScanArgs(h.t, "size", &size)
		what := "publish " + body
		if size > len(body) {
			body += strings.Repeat("-", size-len(body))
			what += fmt.Sprintf(" (%d bytes)", size)
		}
		h.ops = append(h.ops, &ddOp{what: what, pub: publish(n.p, body, nil)})
		g.pump()
	case "consume":
		n := h.upNode(td)
		k := 0
		td.ScanArgs(h.t, "n", &k)
		h.consume(n, k)
		g.pump()
		h.deliveries(b)
	case "ack":
		n := h.upNode(td)
		var off uint64
		td.ScanArgs(h.t, "offset", &off)
		h.ack(td, n, off)
		g.pump()
	case "status":
		for _, n := range g.nodes[1:] {
			b.WriteString(h.status(n))
		}
	case "messages":
		h.messages(h.upNode(td), b)
	default:
		td.Fatalf(h.t, "unknown command %q", td.Cmd)
	}
}

// campaign makes n campaign, on its actor (through the inspection hook,
// so the test goroutine never touches the raft node). A plain campaign
// runs pre-vote first; a forced one is what a leadership transfer's
// MsgTimeoutNow starts.
func (h *ddGroup) campaign(td *datadriven.TestData, n *rnode, force bool) {
	var err error
	h.g.look(n, func() {
		if !force {
			err = n.p.rn.Campaign()
			return
		}
		st := n.p.rn.Status()
		from := n.id%3 + 1 // any other member: raft only logs it
		err = n.p.rn.Step(raftpb.Message{Type: raftpb.MsgTimeoutNow, From: from, To: n.id, Term: st.Term})
	})
	if err != nil {
		td.Fatalf(h.t, "campaign on %d: %v", n.id, err)
	}
	n.p.Poke() // its next turn handles the Ready the campaign made
}

func (h *ddGroup) consume(n *rnode, k int) {
	dc := h.cons[n.id]
	if dc == nil || dc.p != n.p || dc.detached() {
		dc = &ddConsumer{c: &tconsumer{owner: fmt.Sprint("c", n.id), credit: k}, p: n.p}
		if err := n.p.Attach(dc.c); err != nil {
			h.t.Fatalf("attach on %d: %v", n.id, err)
		}
		h.cons[n.id] = dc
		return
	}
	dc.c.addCredit(k)
	n.p.Poke()
}

// deliveries prints the deliveries not printed yet, of every consumer.
func (h *ddGroup) deliveries(b *strings.Builder) {
	for id, dc := range h.cons {
		if dc == nil {
			continue
		}
		ds := dc.c.deliveries()
		for _, d := range ds[dc.seen:] {
			fmt.Fprintf(b, "deliver node=%d offset=%d attempt=%d body=%s\n", id, d.Offset, d.Attempt, showBody(d.Body))
		}
		dc.seen = len(ds)
	}
}

func (h *ddGroup) ack(td *datadriven.TestData, n *rnode, off uint64) {
	var lease uint64
	if dc := h.cons[n.id]; dc != nil {
		for _, d := range dc.c.deliveries() {
			if d.Offset == off {
				lease = d.LeaseID
			}
		}
	}
	if lease == 0 {
		td.Fatalf(h.t, "no delivery of offset %d on node %d", off, n.id)
	}
	ch := make(chan error, 1)
	n.p.Settle(Ack, off, lease, 0, func(err error) { ch <- err })
	h.ops = append(h.ops, &ddOp{what: fmt.Sprint("ack ", off), set: ch})
}

// answered prints the client requests answered since the last command, in
// the order they were made, and keeps the rest waiting.
func (h *ddGroup) answered(b *strings.Builder) {
	h.deliveries(b)
	var still []*ddOp
	for _, op := range h.ops {
		var out string
		select {
		case r := <-op.pub:
			out = "offset " + strconv.FormatUint(r.off, 10)
			if r.err != nil {
				out = errName(r.err)
			}
		case err := <-op.set:
			out = "ok"
			if err != nil {
				out = errName(err)
			}
		default:
			still = append(still, op)
			continue
		}
		fmt.Fprintf(b, "%s: %s\n", op.what, out)
	}
	h.ops = still
	for _, op := range still {
		if !op.told {
			op.told = true
			fmt.Fprintf(b, "%s: pending\n", op.what)
		}
	}
}

func errName(err error) string {
	switch {
	case errors.Is(err, ErrNotLeader):
		return "not_leader"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	}
	return "error: " + err.Error()
}

// status is one replica's line: what raft says of it (role, term, whom it
// follows, its commit index), what the partition applied, and its log.
func (h *ddGroup) status(n *rnode) string {
	if n.down {
		return fmt.Sprintf("%d: down\n", n.id)
	}
	var s strings.Builder
	h.g.look(n, func() {
		st := n.p.rn.Status()
		role := strings.ToLower(strings.TrimPrefix(st.RaftState.String(), "State"))
		fmt.Fprintf(&s, "%d: %s term=%d lead=%d commit=%d applied=%d ckpt=%d log=%s\n",
			n.id, role, st.Term, st.Lead, st.Commit, n.p.applied, n.p.ckptLSN, logTerms(n.p))
	})
	return s.String()
}

// logTerms describes the raft log as first..last and the runs of equal
// terms in it, e.g. "1..5 (1..2@1 3..5@2)".
func logTerms(p *Partition) string {
	first, _ := p.rs.FirstIndex()
	last, _ := p.rs.LastIndex()
	if first > last {
		return fmt.Sprintf("empty (next %d)", last+1)
	}
	var runs []string
	start, term := first, uint64(0)
	for i := first; i <= last+1; i++ {
		var t uint64
		if i <= last {
			var err error
			if t, err = p.rs.Term(i); err != nil {
				return fmt.Sprintf("term of %d: %v", i, err)
			}
		}
		if i == first {
			term = t
			continue
		}
		if t != term || i > last {
			runs = append(runs, fmt.Sprintf("%d..%d@%d", start, i-1, term))
			start, term = i, t
		}
	}
	return fmt.Sprintf("%d..%d (%s)", first, last, strings.Join(runs, " "))
}

// messages prints n's unsettled messages, read on its actor: on a leader
// its decided state, on a follower the committed one.
func (h *ddGroup) messages(n *rnode, b *strings.Builder) {
	var lines []string
	h.g.look(n, func() {
		r := n.p.peek(0, 1000)
		lines = append(lines, fmt.Sprintf("next=%d", r.NextLSN))
		for _, m := range r.Messages {
			body := "<unreadable: " + fmt.Sprint(m.Err) + ">"
			if m.Err == nil {
				body = showBody(m.Msg.Body)
			}
			lines = append(lines, fmt.Sprintf("%d %s body=%s", m.Info.Offset, stateOf(m.Info), body))
		}
	})
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
}

// showBody prints a body padded by publish size= as its name and length.
func showBody(b []byte) string {
	name, pad, _ := strings.Cut(string(b), "-")
	if pad == "" {
		return string(b)
	}
	return fmt.Sprintf("%s (%d bytes)", name, len(b))
}

func stateOf(in queue.Info) string {
	s := in.State.String()
	if in.State == queue.StateInflight && in.Attempt > 0 {
		s += fmt.Sprintf(" attempt=%d", in.Attempt)
	}
	return s
}

// detached reports whether the partition detached the consumer (it
// stepped down).
func (dc *ddConsumer) detached() bool {
	dc.c.mu.Lock()
	defer dc.c.mu.Unlock()
	return dc.c.detached != nil
}
