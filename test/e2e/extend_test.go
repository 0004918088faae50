package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/protocol"
)

// extendLeaseMs is the queue lease of the EXTEND tests: short, so a handler
// that outlives it by far takes a second or so.
const extendLeaseMs = 300

// extend sends EXTEND and returns its codes.
func (c *client) extend(ex *protocol.Extend) []protocol.Code {
	c.t.Helper()
	r, ok := c.call(ex).(*protocol.SettleResult)
	if !ok {
		c.t.Fatalf("EXTEND %+v: got %+v, want SETTLE_RESULT", ex, r)
	}
	return r.Codes
}

func codes(cs ...protocol.Code) []protocol.Code { return cs }

// metricValue reads an unlabelled series from a /metrics page (-1 when it
// is missing).
func metricValue(t *testing.T, page, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// TestExtendKeepsLeaseOnRealBroker runs `sinew serve` and holds a delivery
// of a queue with a 300 ms lease for three leases' time, extending it as it
// goes: the message is never delivered again, the ACK by the same tag and
// lease reference is ok, and the next delivery is the sentinel published
// after it. Bad EXTENDs get their typed codes and the connection carries on.
func TestExtendKeepsLeaseOnRealBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	admin := freeAddr(t)
	srv := startChildArgs(t, bin, t.TempDir(), "--queue-lease-ms-max", "60000", "--admin-listen", admin)
	c := dial(t, srv.addr)
	c.declare(&protocol.DeclareQueue{Topic: "ext", MaxRetries: -1, LeaseMs: extendLeaseMs})
	sub := c.subscribe(&protocol.Subscribe{Topic: "ext", Partition: -1, Prefetch: 1})
	c.publish(&protocol.Publish{Topic: "ext", Partition: -1, Body: []byte("slow")})
	d := c.next()
	ref := protocol.LeaseRef{SubID: sub.SubID, Partition: d.Partition, Offset: d.Offset, LeaseID: d.LeaseID, Epoch: d.Epoch}

	// The handler runs three leases' time, extending every third of a
	// lease (by tag alone, and by tag and reference, in turn).
	start := time.Now()
	extensions := 0
	for i := 0; time.Since(start) < 3*extendLeaseMs*time.Millisecond; i++ {
		// Twice the lease each time: a slow round trip on a busy machine
		// does not lose it.
		ex := &protocol.Extend{Tags: []uint64{d.Tag}, ExtendMs: 2 * extendLeaseMs}
		if i%2 == 1 {
			ex.Leases = []protocol.LeaseRef{ref}
		}
		if got := c.extend(ex); !slices.Equal(got, codes(protocol.CodeOK)) {
			t.Fatalf("extension %d after %v: %v, want ok\n%s", i, time.Since(start), got, srv.log())
		}
		extensions++
		time.Sleep(extendLeaseMs / 3 * time.Millisecond) // the handler's work
	}
	if n := c.pending(); n != 0 {
		t.Fatalf("delivered again while extended: %+v", backlog[c][0])
	}
	if got := metricValue(t, scrape(t, admin), "sinew_lease_extensions_total"); got != float64(extensions) {
		t.Fatalf("sinew_lease_extensions_total = %v after %d extensions", got, extensions)
	}

	// Bad input: typed codes, nothing applied, the connection carries on.
	for _, tc := range []struct {
		name string
		ex   *protocol.Extend
		want []protocol.Code
	}{
		{"extend_ms 0", &protocol.Extend{Tags: []uint64{d.Tag}, ExtendMs: 0}, codes(protocol.CodeBadRequest)},
		{"extend_ms negative", &protocol.Extend{Tags: []uint64{d.Tag}, ExtendMs: -5}, codes(protocol.CodeBadRequest)},
		{"extend_ms above queue.lease_ms_max", &protocol.Extend{Tags: []uint64{d.Tag}, ExtendMs: 60_001}, codes(protocol.CodeBadRequest)},
		{"leases of the wrong length", &protocol.Extend{Tags: []uint64{d.Tag, 999}, ExtendMs: 1000, Leases: []protocol.LeaseRef{ref}},
			codes(protocol.CodeBadRequest, protocol.CodeBadRequest)},
		{"unknown tag", &protocol.Extend{Tags: []uint64{999}, ExtendMs: 1000}, codes(protocol.CodeUnknownTag)},
		{"tag 0 without a reference", &protocol.Extend{Tags: []uint64{0}, ExtendMs: 1000}, codes(protocol.CodeUnknownTag)},
		{"reference to a lease that does not exist", &protocol.Extend{Tags: []uint64{0}, ExtendMs: 1000,
			Leases: []protocol.LeaseRef{{SubID: sub.SubID, Partition: d.Partition, Offset: d.Offset, LeaseID: d.LeaseID + 1}}}, codes(protocol.CodeStaleLease)},
		{"mixed: held and unknown", &protocol.Extend{Tags: []uint64{d.Tag, 999}, ExtendMs: extendLeaseMs}, codes(protocol.CodeOK, protocol.CodeUnknownTag)},
	} {
		if got := c.extend(tc.ex); !slices.Equal(got, tc.want) {
			t.Fatalf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if e, ok := c.call(&protocol.Extend{ExtendMs: 1000}).(*protocol.ErrorBody); !ok || e.Code != protocol.CodeBadRequest || e.Fatal {
		t.Fatalf("EXTEND without tags: %+v, want a non-fatal bad_request", e)
	}
	// NO_REPLY: nothing for an ok extension; an ERROR for a failed one.
	c.send(protocol.FlagNoReply, &protocol.Extend{Tags: []uint64{d.Tag}, ExtendMs: extendLeaseMs})
	id := c.send(protocol.FlagNoReply, &protocol.Extend{Tags: []uint64{999}, ExtendMs: 1000})
	h, b := c.read()
	if e, ok := b.(*protocol.ErrorBody); !ok || h.RequestID != id || e.Code != protocol.CodeUnknownTag {
		t.Fatalf("NO_REPLY EXTEND of an unknown tag: %s %+v (request %d), want ERROR unknown_tag for request %d", h.Op, b, h.RequestID, id)
	}

	// Still held: the ACK by tag and reference is ok, and the message is
	// done with for good.
	ack, ok := c.call(&protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{d.Tag}, Leases: []protocol.LeaseRef{ref}}).(*protocol.SettleResult)
	if !ok || !slices.Equal(ack.Codes, codes(protocol.CodeOK)) {
		t.Fatalf("ACK after the extensions: %+v\n%s", ack, srv.log())
	}
	if got := c.extend(&protocol.Extend{Tags: []uint64{d.Tag}, ExtendMs: 1000}); !slices.Equal(got, codes(protocol.CodeStaleLease)) {
		t.Fatalf("EXTEND after the ACK: %v, want stale_lease", got)
	}
	c.publish(&protocol.Publish{Topic: "ext", Partition: -1, Body: []byte("sentinel")})
	if n := c.next(); string(n.Body) != "sentinel" || n.Attempt != 1 {
		t.Fatalf("next delivery %q attempt %d, want the sentinel: the extended message came back", n.Body, n.Attempt)
	}
	c.quiet()
}

// TestExtendedLeaseExpiresAtItsNewDeadline: an extension that is not
// renewed ends like any lease: the message comes back with the next
// attempt, and a late EXTEND of the ended lease is stale_lease.
func TestExtendedLeaseExpiresAtItsNewDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	srv := startChildArgs(t, bin, t.TempDir())
	c := dial(t, srv.addr)
	c.declare(&protocol.DeclareQueue{Topic: "ext-end", MaxRetries: -1, LeaseMs: extendLeaseMs})
	c.subscribe(&protocol.Subscribe{Topic: "ext-end", Partition: -1, Prefetch: 1})
	c.publish(&protocol.Publish{Topic: "ext-end", Partition: -1, Body: []byte("m")})
	d := c.next()
	if got := c.extend(&protocol.Extend{Tags: []uint64{d.Tag}, ExtendMs: 2 * extendLeaseMs}); !slices.Equal(got, codes(protocol.CodeOK)) {
		t.Fatalf("EXTEND: %v", got)
	}
	again := c.next() // waits out the extended lease
	if again.Offset != d.Offset || again.Attempt != d.Attempt+1 || again.LeaseID == d.LeaseID {
		t.Fatalf("redelivery %+v of %+v", again, d)
	}
	if got := c.extend(&protocol.Extend{Tags: []uint64{d.Tag}, ExtendMs: 1000}); !slices.Equal(got, codes(protocol.CodeStaleLease)) {
		t.Fatalf("EXTEND of the expired lease: %v, want stale_lease\n%s", got, srv.log())
	}
	if got := c.settle(protocol.OpAck, 0, again.Tag); !slices.Equal(got, codes(protocol.CodeOK)) {
		t.Fatalf("ACK of the redelivery: %v", got)
	}
}

// TestExtendSurvivesARestart: the extension is written to the partition's
// log before it is answered. A consumer extends its delivery of a queue
// with a 1 s lease to 30 s, holds it past the first deadline, and the
// broker is killed with -9 and started again. The lease recovered from the
// log has the extended deadline (the first one passed while the broker was
// down, so without the extension the lease would expire at once): the
// consumer resumes within the restart window, its ACK is ok, and another
// consumer, connected across the restart, never receives the message.
func TestExtendSurvivesARestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	srv := startChildArgs(t, bin, dir, "--listen", addr)
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
	defer cancel()
	const lease = time.Second

	owner, err := sinew.Dial(ctx, addr, fastReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if _, err := owner.DeclareQueue(ctx, "ext-restart", sinew.QueueConfig{Lease: lease}); err != nil {
		t.Fatal(err)
	}
	sub, err := owner.Subscribe(ctx, "ext-restart", sinew.WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.PublishText(ctx, "ext-restart", "held"); err != nil {
		t.Fatal(err)
	}
	var m *sinew.Message
	select {
	case m = <-sub.Messages():
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	if err := m.Extend(ctx, 30*lease); err != nil {
		t.Fatal(err)
	}
	other, err := sinew.Dial(ctx, addr, fastReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	osub, err := other.Subscribe(ctx, "ext-restart", sinew.WithPrefetch(10))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * lease) // the handler's work, past the first deadline

	signalChild(t, srv, syscall.SIGKILL)
	srv2 := startChildArgs(t, bin, dir, "--listen", addr)
	waitLog(t, srv2, "restart window started", "leases_reclaimed=1")
	if err := m.Complete(ctx); err != nil {
		t.Fatalf("ACK of the extended lease after the restart: %v\n%s", err, srv2.log())
	}
	if err := sub.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.PublishText(ctx, "ext-restart", "sentinel"); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-osub.Messages():
		if got.Text() != "sentinel" {
			t.Fatalf("the other consumer received %q (attempt %d), want only the sentinel: the extension was lost\n%s", got.Text(), got.Attempt, srv2.log())
		}
		if err := got.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatalf("the other consumer got nothing:\n%s", srv2.log())
	}
	signalChild(t, srv2, syscall.SIGTERM)
}

// TestClusterExtendReachesTheOwner: in a three-node cluster a client
// subscribed across the nodes holds one message of each partition (their
// owners on different nodes) for three leases' time, extending them
// through the SDK: none is delivered again. Then one owner is killed with
// -9: the next extension of its partition's message goes to the new owner
// by lease reference and is applied there, and every message completes.
func TestClusterExtendReachesTheOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, _, _ := startThreeVoting(t, bin)
	byAddr, _, client := seededClient(t, nodes, 0)
	const topic, parts, lease = "ext-cluster", 3, time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*safetyTimeout)
	defer cancel()
	if _, err := client.DeclareQueue(ctx, topic, sinew.QueueConfig{Partitions: parts, Lease: lease}); err != nil {
		t.Fatal(err)
	}
	sub, err := client.Subscribe(ctx, topic, sinew.WithPrefetch(16))
	if err != nil {
		t.Fatal(err)
	}
	for i := range parts {
		if _, err := client.Publish(ctx, topic, []byte(fmt.Sprintf("m-%d", i)), sinew.WithPartition(i)); err != nil {
			t.Fatal(err)
		}
	}
	held := map[uint32]*sinew.Message{}
	for len(held) < parts {
		select {
		case m := <-sub.Messages():
			if held[m.Partition] != nil {
				t.Fatalf("partition %d delivered twice: %q attempt %d", m.Partition, m.Body, m.Attempt)
			}
			held[m.Partition] = m
		case <-ctx.Done():
			t.Fatalf("%d of %d partitions delivered", len(held), parts)
		}
	}
	owner0 := queuePartitionOwner(t, nodes, topic, 0)
	for start := time.Now(); time.Since(start) < 3*lease; {
		for p, m := range held {
			if err := m.Extend(ctx, 2*lease); err != nil {
				t.Fatalf("extend partition %d: %v", p, err)
			}
		}
		time.Sleep(lease / 3) // the handler's work
	}
	select {
	case m := <-sub.Messages():
		t.Fatalf("delivered %q (attempt %d) again while extended", m.Body, m.Attempt)
	default:
	}
	// Long enough for the failover below.
	for p, m := range held {
		if err := m.Extend(ctx, 20*lease); err != nil {
			t.Fatalf("extend partition %d: %v", p, err)
		}
	}
	killed := byAddr[owner0]
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed.cmd.Wait()
	if err := held[0].Extend(ctx, 20*lease); err != nil {
		t.Fatalf("extend partition 0 after its owner %s was killed: %v", owner0, err)
	}
	for p, m := range held {
		if err := m.Complete(ctx); err != nil {
			t.Fatalf("complete partition %d: %v", p, err)
		}
	}
	select {
	case m := <-sub.Messages():
		t.Fatalf("delivered %q (attempt %d) again after its complete", m.Body, m.Attempt)
	default:
	}
}

// queuePartitionOwner asks the nodes' admin APIs which one owns partition
// p of topic (bounded wait for an owner to be known).
func queuePartitionOwner(t *testing.T, nodes []*clusterChild, topic string, p int) string {
	t.Helper()
	deadline := time.Now().Add(safetyTimeout)
	for {
		for _, c := range nodes {
			var v struct {
				Partitions []struct {
					Owner string `json:"owner"`
				} `json:"partitions"`
			}
			getJSONInto(t, "http://"+c.admin+"/api/v1/queues/"+topic, &v)
			if p < len(v.Partitions) && v.Partitions[p].Owner == c.addr {
				return c.addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no owner of %s partition %d", topic, p)
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
}
