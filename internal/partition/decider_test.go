package partition

import (
	"bytes"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"pgregory.net/rapid"

	"github.com/sinewmq/sinew/internal/dedup"
	"github.com/sinewmq/sinew/internal/queue"
)

// dconsumer is a consumer as the decider sees it: credit only. The
// decider never delivers or tells a consumer anything itself (the driver
// does, when a stage is released), so those methods fail the test.
type dconsumer struct {
	t      *testing.T
	name   string
	credit int
	carry  bool // CarryCredit accepts
}

func (c *dconsumer) Owner() string { return c.name }
func (c *dconsumer) TakeCredit(max int) int {
	n := min(c.credit, max)
	c.credit -= n
	return n
}
func (c *dconsumer) RefundCredit(n int) { c.credit += n }
func (c *dconsumer) Deliver(Delivery) {
	c.t.Fatalf("decider delivered to %s: only the driver delivers", c.name)
}
func (c *dconsumer) LeaseEnded(uint64, uint64) {
	c.t.Fatalf("decider told %s a lease ended: only the driver does", c.name)
}
func (c *dconsumer) Detached(error) { c.t.Fatalf("decider detached %s", c.name) }
func (c *dconsumer) CarryCredit(uint64, uint64) bool {
	return c.carry
}

// deciderHarness drives a decider alone, keeps the records it decides as
// the log would, and releases its open stage after every step as the
// driver does once the stage is durable.
type deciderHarness struct {
	t         *testing.T
	qcfg      queue.Config
	d         *decider
	log       []record // every record decided, payloads owned
	consumers map[string]*dconsumer
	now       int64
	replies   []string // filled by the reply callbacks as the stage is released
}

func newDeciderHarness(t *testing.T) *deciderHarness {
	h := &deciderHarness{t: t, qcfg: queue.Config{LeaseMs: 10_000, MaxRetries: 2}, consumers: map[string]*dconsumer{}}
	h.d = h.fresh(queue.New(h.qcfg), dedup.New(dedup.Config{}), 1)
	return h
}

func (h *deciderHarness) fresh(st *queue.State, dd *dedup.Table, next uint64) *decider {
	return &decider{st: st, dd: dd, counters: new(Counters), logger: slog.New(slog.DiscardHandler),
		holders: map[uint64]holder{}, acked: newAckMemory(),
		nextLSN: next, lastLSN: next - 1}
}

// TestDeciderScenarios runs the scripts in testdata/decider against the
// decider alone: no log, no goroutine, no clock. Each step prints the
// records decided (LSN: event), then releases the open stage as the driver
// would once they are durable and prints its effects in release order:
// replies (with the LSN each waits for), deliveries, ended leases, new dead
// letters, carried credit given back; and "more" when a bounded step left
// work for the next turn. Regenerate with -rewrite and review the diff.
//
// Commands (now=T moves the clock; it never goes back):
//
//	config [lease-ms=N] [max-retries=N] [target=NAME]
//	attach c=NAME credit=N [carry]
//	credit c=NAME n=N            give NAME more credit (a settle answered)
//	detach c=NAME [now=T]
//	detach-keep c=NAME keep=MS [undelivered=OFFSET:LEASE,...] [now=T]
//	                             DetachKeeping; undelivered are the leases
//	                             whose deliveries still wait in a stage
//	claim owner=NAME
//	turn [now=T]                 one turn; its input lines are the batch:
//	    publish [producer=P seq=N] [delay=MS]
//	    ack|nack|fail offset=X lease=L [by=NAME] [delay=MS]
//	    purge
//	    discard offset=X
//	restart [grace=MS] [now=T]   rebuild from the records so far, as Open
//	adoptable c=NAME [now=T]
//	state                        credits and holders
func TestDeciderScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/decider", func(t *testing.T, path string) {
		h := newDeciderHarness(t)
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			if td.HasArg("now") {
				var at int64
				td.ScanArgs(t, "now", &at)
				if at < h.now {
					td.Fatalf(t, "clock goes back from %d to %d", h.now, at)
				}
				h.now = at
			}
			d := h.d
			switch td.Cmd {
			case "config":
				td.MaybeScanArgs(t, "lease-ms", &h.qcfg.LeaseMs)
				td.MaybeScanArgs(t, "max-retries", &h.qcfg.MaxRetries)
				td.MaybeScanArgs(t, "target", &h.qcfg.DeadLetter.Target)
				d.onControl(control{kind: ctlSetConfig, cfg: h.qcfg}, h.now)
				return h.step()
			case "attach":
				var name string
				td.ScanArgs(t, "c", &name)
				c := &dconsumer{t: t, name: name, carry: td.HasArg("carry")}
				td.MaybeScanArgs(t, "credit", &c.credit)
				h.consumers[name] = c
				d.onControl(control{kind: ctlAttach, c: c}, h.now)
				return h.step()
			case "credit":
				c := h.consumer(td)
				var n int
				td.ScanArgs(t, "n", &n)
				c.credit += n
				return "ok"
			case "detach":
				d.onControl(control{kind: ctlDetach, c: h.consumer(td)}, h.now)
				return h.step()
			case "detach-keep":
				var keep int64
				td.ScanArgs(t, "keep", &keep)
				var undelivered map[uint64]uint64
				if td.HasArg("undelivered") {
					var list string
					td.ScanArgs(t, "undelivered", &list)
					undelivered = map[uint64]uint64{}
					for _, pair := range strings.Split(list, ",") {
						o, l, _ := strings.Cut(pair, ":")
						off, err1 := strconv.ParseUint(o, 10, 64)
						lease, err2 := strconv.ParseUint(l, 10, 64)
						if err1 != nil || err2 != nil {
							td.Fatalf(t, "undelivered %q: want OFFSET:LEASE", pair)
						}
						undelivered[off] = lease
					}
				}
				d.detachKeeping(h.consumer(td), keep, undelivered, h.now)
				return h.step()
			case "claim":
				var owner string
				td.ScanArgs(t, "owner", &owner)
				var got []queue.Info
				d.onControl(control{kind: ctlClaim, owner: owner, claimed: func(in []queue.Info) { got = in }}, h.now)
				return "claimed " + offsets(got)
			case "adoptable":
				return "adoptable " + offsets(d.adoptable(h.consumer(td), h.now))
			case "turn":
				var batch []command
				for i, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
					if line = strings.TrimSpace(line); line != "" {
						batch = append(batch, h.command(td, i+1, line))
					}
				}
				d.decide(batch, h.now)
				return h.step()
			case "restart":
				var grace int64
				td.MaybeScanArgs(t, "grace", &grace)
				return h.restart(grace)
			case "state":
				return h.state()
			default:
				td.Fatalf(t, "unknown command %q", td.Cmd)
				return ""
			}
		})
	})
}

func (h *deciderHarness) consumer(td *datadriven.TestData) *dconsumer {
	var name string
	td.ScanArgs(h.t, "c", &name)
	c, ok := h.consumers[name]
	if !ok {
		td.Fatalf(h.t, "no consumer %q", name)
	}
	return c
}

// command parses one batch line into an inbox command whose callbacks
// record the answer as "#i ..." when the stage is released.
func (h *deciderHarness) command(td *datadriven.TestData, i int, line string) command {
	fields := strings.Fields(line)
	args := map[string]string{}
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		args[k] = v
	}
	num := func(k string) uint64 {
		if args[k] == "" {
			return 0
		}
		n, err := strconv.ParseUint(args[k], 10, 64)
		if err != nil {
			td.Fatalf(h.t, "line %d: %s=%q: %v", i, k, args[k], err)
		}
		return n
	}
	published := func(off uint64, dup bool, err error) {
		h.replies = append(h.replies, fmt.Sprintf("#%d %s: offset=%d%s%s", i, fields[0], off, flag(dup, " duplicate"), errText(err)))
	}
	settled := func(err error) {
		h.replies = append(h.replies, fmt.Sprintf("#%d %s%s", i, fields[0], errText(err)))
	}
	switch fields[0] {
	case "publish":
		m := queue.Message{PublishedAtMs: max(h.now, 1), // 0 would be filled in by Enqueue
			ProducerID: args["producer"], ProducerSeq: num("seq")}
		if delay := num("delay"); delay > 0 {
			m.NotBeforeMs = h.now + int64(delay)
		}
		full := m
		full.Body = []byte("body-" + strconv.Itoa(i))
		ev := queue.Event{Kind: queue.KindEnqueue, Msg: &full}
		return command{kind: cmdPublish, msg: m, payload: ev.Marshal(nil), published: published}
	case "ack", "nack", "fail":
		op := map[string]SettleOp{"ack": Ack, "nack": Nack, "fail": Fail}[fields[0]]
		c := command{kind: cmdSettle, op: op, offset: num("offset"), leaseID: num("lease"), settled: settled}
		if delay := num("delay"); delay > 0 {
			c.notBeforeMs = h.now + int64(delay)
		}
		if by := args["by"]; by != "" {
			c.by = h.consumers[by]
		}
		return c
	case "purge":
		return command{kind: cmdPurge, published: published}
	case "discard":
		return command{kind: cmdDiscard, offset: num("offset"), settled: settled}
	}
	td.Fatalf(h.t, "line %d: unknown command %q", i, fields[0])
	return command{}
}

// step prints the records the decider queued since the last step (and
// takes them, as flush would), then releases the open stage.
func (h *deciderHarness) step() string {
	d := h.d
	var b strings.Builder
	for i := range d.out {
		r := d.out[i]
		p := d.payloadOf(&r)
		r.payload, r.start, r.end = slices.Clone(p), 0, 0
		h.log = append(h.log, r)
		fmt.Fprintf(&b, "%d: %s\n", r.lsn, eventText(h.t, r.typ, p))
	}
	d.taken()
	st := &d.open
	for _, r := range st.replies {
		before := len(h.replies)
		if r.published != nil {
			r.published(r.offset, r.duplicate, r.err)
		} else {
			r.settled(r.err)
		}
		for _, s := range h.replies[before:] {
			fmt.Fprintf(&b, "reply %s (after lsn %d)\n", s, r.lsn)
		}
	}
	st.replies = st.replies[:0]
	for _, cr := range st.carried {
		if cr.n > 0 {
			fmt.Fprintf(&b, "carried credit back: %s %d\n", cr.c.Owner(), cr.n)
		}
	}
	refundCarried(st)
	for _, p := range st.deliveries {
		fmt.Fprintf(&b, "deliver %s offset=%d lease=%d attempt=%d\n", p.c.Owner(), p.offset, p.leaseID, p.attempt)
	}
	st.deliveries = st.deliveries[:0]
	for _, p := range st.ended {
		fmt.Fprintf(&b, "ended %s offset=%d lease=%d\n", p.c.Owner(), p.offset, p.leaseID)
	}
	st.ended = st.ended[:0]
	for _, off := range st.newDead {
		fmt.Fprintf(&b, "dead-letter copy offset=%d\n", off)
	}
	st.newDead = st.newDead[:0]
	st.records = 0
	if d.more {
		b.WriteString("more\n")
		d.more = false
	}
	if b.Len() == 0 {
		return "ok"
	}
	return b.String()
}

// restart rebuilds the decider from the records decided so far, as Open's
// recovery does: a fresh queue state and dedup table replay the log, the
// leases found wait for the grace, and no consumer is attached.
func (h *deciderHarness) restart(graceMs int64) string {
	st, dd := queue.New(h.qcfg), dedup.New(dedup.Config{})
	d := h.fresh(st, dd, uint64(len(h.log))+1)
	for _, r := range h.log {
		ev, err := queue.DecodeEvent(r.typ, r.payload)
		if err != nil {
			h.t.Fatalf("replay lsn %d: %v", r.lsn, err)
		}
		if err := st.Apply(r.lsn, ev); err != nil {
			h.t.Fatalf("replay lsn %d: %v", r.lsn, err)
		}
		switch ev.Kind {
		case queue.KindAck:
			d.acked.put(ev.Offset, ev.LeaseID)
		case queue.KindEnqueue:
			dd.Record(ev.Msg.ProducerID, ev.Msg.ProducerSeq, r.lsn, ev.Msg.PublishedAtMs)
		}
	}
	d.recovered = st.Leases()
	d.recoveredDueMs = h.now + graceMs
	h.d = d
	h.consumers = map[string]*dconsumer{}
	return "recovered leases " + offsets(d.recovered)
}

func (h *deciderHarness) state() string {
	var b strings.Builder
	names := make([]string, 0, len(h.consumers))
	for n := range h.consumers {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&b, "consumer %s credit=%d\n", n, h.consumers[n].credit)
	}
	offs := make([]uint64, 0, len(h.d.holders))
	for off := range h.d.holders {
		offs = append(offs, off)
	}
	slices.Sort(offs)
	for _, off := range offs {
		hd := h.d.holders[off]
		fmt.Fprintf(&b, "held offset=%d lease=%d by %s\n", off, hd.leaseID, hd.c.Owner())
	}
	s := h.d.st.Stats(h.now)
	fmt.Fprintf(&b, "next-lsn=%d ready=%d inflight=%d dedup-duplicates=%d", h.d.nextLSN, s.Ready, s.Inflight, h.d.duplicates)
	return b.String()
}

func eventText(t *testing.T, typ uint8, payload []byte) string {
	ev, err := queue.DecodeEvent(typ, payload)
	if err != nil {
		t.Fatalf("decode %d: %v", typ, err)
	}
	var b strings.Builder
	b.WriteString(ev.Kind.String())
	if ev.Kind == queue.KindEnqueue {
		if ev.Msg.ProducerID != "" {
			fmt.Fprintf(&b, " producer=%s seq=%d", ev.Msg.ProducerID, ev.Msg.ProducerSeq)
		}
		if ev.Msg.NotBeforeMs != 0 {
			fmt.Fprintf(&b, " not-before=%d", ev.Msg.NotBeforeMs)
		}
		return b.String()
	}
	fmt.Fprintf(&b, " offset=%d", ev.Offset)
	if ev.LeaseID != 0 {
		fmt.Fprintf(&b, " lease=%d", ev.LeaseID)
	}
	if ev.Owner != "" {
		fmt.Fprintf(&b, " owner=%s attempt=%d", ev.Owner, ev.Attempt)
	}
	if ev.Reason != queue.ReasonNone {
		fmt.Fprintf(&b, " reason=%s", ev.Reason)
	}
	if ev.Target != "" {
		fmt.Fprintf(&b, " target=%s", ev.Target)
	}
	return b.String()
}

func offsets(in []queue.Info) string {
	if len(in) == 0 {
		return "none"
	}
	s := make([]string, len(in))
	for i, x := range in {
		s[i] = fmt.Sprintf("%d(lease=%d owner=%s)", x.Offset, x.LeaseID, x.Owner)
	}
	return strings.Join(s, " ")
}

func flag(b bool, s string) string {
	if b {
		return s
	}
	return ""
}

func errText(err error) string {
	if err == nil {
		return " ok"
	}
	return " error: " + err.Error()
}

// TestDeciderRecordsReplay: whatever the decider decides, the records it
// numbers are dense, in LSN order, and replaying them into a fresh queue
// state gives the decider's own state, byte for byte in the snapshot. That
// is what lets a replica (or recovery) rebuild the state from the log alone.
// Random commands, consumers, settles (current and stale), purges,
// discards, detaches and clock moves.
func TestDeciderRecordsReplay(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		h := newDeciderHarness(t)
		h.qcfg = queue.Config{
			LeaseMs:      rapid.SampledFrom([]int64{50, 1000}).Draw(rt, "leaseMs"),
			MaxRetries:   rapid.IntRange(0, 2).Draw(rt, "maxRetries"),
			DefaultTTLMs: rapid.SampledFrom([]int64{0, 0, 300}).Draw(rt, "ttlMs"),
		}
		if rapid.Bool().Draw(rt, "target") {
			h.qcfg.DeadLetter.Target = "dlq"
		}
		h.d.st.SetConfig(h.qcfg)
		var consumers []*dconsumer
		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for i := range steps {
			d := h.d
			h.now += rapid.Int64Range(0, 400).Draw(rt, "advance")
			switch rapid.IntRange(0, 9).Draw(rt, "op") {
			case 0:
				c := &dconsumer{t: t, name: fmt.Sprintf("c%d", i), credit: rapid.IntRange(0, 5).Draw(rt, "credit"),
					carry: rapid.Bool().Draw(rt, "carry")}
				consumers = append(consumers, c)
				d.onControl(control{kind: ctlAttach, c: c}, h.now)
			case 1:
				if len(consumers) > 0 {
					k := rapid.IntRange(0, len(consumers)-1).Draw(rt, "detach")
					d.onControl(control{kind: ctlDetach, c: consumers[k]}, h.now)
					consumers = slices.Delete(consumers, k, k+1)
				}
			case 2:
				for _, c := range consumers {
					c.credit += rapid.IntRange(0, 3).Draw(rt, "more")
				}
			default:
				var batch []command
				for j := range rapid.IntRange(0, 6).Draw(rt, "batch") {
					batch = append(batch, h.randomCommand(rt, j))
				}
				d.decide(batch, h.now)
			}
			h.step()
			h.checkReplay(rt)
		}
	})
}

// randomCommand draws one inbox command; settles name a held lease, or a
// made-up one that the queue refuses.
func (h *deciderHarness) randomCommand(rt *rapid.T, j int) command {
	next := max(h.d.nextLSN, 2)
	ignore := func(uint64, bool, error) {}
	ignoreSettle := func(error) {}
	switch rapid.IntRange(0, 5).Draw(rt, "cmd") {
	case 0, 1:
		m := queue.Message{PublishedAtMs: max(h.now, 1)}
		if rapid.IntRange(0, 3).Draw(rt, "dedup") == 0 {
			m.ProducerID, m.ProducerSeq = "p", uint64(rapid.IntRange(1, 5).Draw(rt, "seq"))
		}
		if rapid.IntRange(0, 3).Draw(rt, "delayed") == 0 {
			m.NotBeforeMs = h.now + rapid.Int64Range(1, 500).Draw(rt, "delay")
		}
		if h.qcfg.DefaultTTLMs > 0 {
			m.ExpiresAtMs = m.PublishedAtMs + h.qcfg.DefaultTTLMs
		}
		full := m
		full.Body = []byte(fmt.Sprintf("b%d", j))
		ev := queue.Event{Kind: queue.KindEnqueue, Msg: &full}
		return command{kind: cmdPublish, msg: m, payload: ev.Marshal(nil), published: ignore}
	case 2, 3:
		c := command{kind: cmdSettle, op: rapid.SampledFrom([]SettleOp{Ack, Ack, Nack, Fail}).Draw(rt, "op"),
			settled: ignoreSettle}
		offs := make([]uint64, 0, len(h.d.holders))
		for off := range h.d.holders {
			offs = append(offs, off)
		}
		slices.Sort(offs)
		if len(offs) > 0 && rapid.IntRange(0, 4).Draw(rt, "stale") > 0 {
			c.offset = offs[rapid.IntRange(0, len(offs)-1).Draw(rt, "held")]
			hd := h.d.holders[c.offset]
			c.leaseID = hd.leaseID
			if rapid.Bool().Draw(rt, "by") {
				c.by = hd.c
			}
		} else {
			c.offset = uint64(rapid.Int64Range(1, int64(next)).Draw(rt, "offset"))
			c.leaseID = uint64(rapid.IntRange(1, 20).Draw(rt, "lease"))
		}
		if c.op == Nack {
			c.notBeforeMs = h.now + rapid.Int64Range(0, 300).Draw(rt, "notBefore")
		}
		return c
	case 4:
		return command{kind: cmdDiscard, offset: uint64(rapid.Int64Range(1, int64(next)).Draw(rt, "discard")),
			settled: ignoreSettle}
	default:
		return command{kind: cmdPurge, published: ignore}
	}
}

// checkReplay replays every record decided so far into a fresh state and
// compares it with the decider's.
func (h *deciderHarness) checkReplay(rt *rapid.T) {
	st := queue.New(h.qcfg)
	for i, r := range h.log {
		if r.lsn != uint64(i)+1 {
			rt.Fatalf("record %d has lsn %d: not dense", i, r.lsn)
		}
		ev, err := queue.DecodeEvent(r.typ, r.payload)
		if err != nil {
			rt.Fatalf("lsn %d: %v", r.lsn, err)
		}
		if err := st.Apply(r.lsn, ev); err != nil {
			rt.Fatalf("replay lsn %d (%v): %v", r.lsn, ev.Kind, err)
		}
	}
	if got, want := st.Snapshot(nil), h.d.st.Snapshot(nil); !bytes.Equal(got, want) {
		rt.Fatalf("replayed state differs from the decider's (next lsn %d vs %d)", st.NextLSN(), h.d.st.NextLSN())
	}
	if h.d.nextLSN != uint64(len(h.log))+1 || h.d.lastLSN != uint64(len(h.log)) {
		rt.Fatalf("decider at next %d last %d after %d records", h.d.nextLSN, h.d.lastLSN, len(h.log))
	}
}
