package e2e_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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
		ex := &protocol.Extend{Tags: []uint64{d.Tag}, ExtendMs: extendLeaseMs}
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
