package server

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/session/bridge"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// fakeNow is a settable clock for the broker.
type fakeNow struct{ ms atomic.Int64 }

func (f *fakeNow) now() time.Time          { return time.UnixMilli(f.ms.Load()) }
func (f *fakeNow) advance(d time.Duration) { f.ms.Add(d.Milliseconds()) }

// startRealClock is startReal with the broker on clk, returning the broker
// too, so a test can read lease deadlines.
func startRealClock(t *testing.T, clk *fakeNow, mod func(*Config)) (*fixture, *broker.Broker) {
	t.Helper()
	b, err := broker.Open(broker.Config{DataDir: "/data", FS: vfs.NewMem(), Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("broker close: %v", err)
		}
	})
	return start(t, func(c *Config) {
		c.Backend = bridge.New(b)
		if mod != nil {
			mod(c)
		}
	}), b
}

// deadline reads the lease deadline of offset in topic's partition 0.
func deadline(t *testing.T, b *broker.Broker, topic string, offset uint64) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
	defer cancel()
	r, err := b.Peek(ctx, topic, "", 0, offset, 1)
	if err != nil || len(r.Messages) == 0 || r.Messages[0].Info.Offset != offset {
		t.Fatalf("peek %s offset %d: %+v %v", topic, offset, r, err)
	}
	return r.Messages[0].Info.DeadlineMs
}

func (c *client) extend(tags []uint64, extendMs int64, leases []protocol.LeaseRef) []protocol.Code {
	c.t.Helper()
	id := c.send(0, &protocol.Extend{Tags: tags, ExtendMs: extendMs, Leases: leases})
	h, r := expect[*protocol.SettleResult](c)
	if h.RequestID != id {
		c.t.Fatalf("SETTLE_RESULT for request %d, want %d", h.RequestID, id)
	}
	return r.Codes
}

// TestExtendSemantics: EXTEND over the wire against the real broker, its
// clock faked: the deadline becomes the broker's now plus extend_ms (later
// or earlier), the lease id and attempt stay, a later ACK by the same tag
// and reference applies, and each refusal has its code and changes nothing.
func TestExtendSemantics(t *testing.T) {
	clk := &fakeNow{}
	clk.ms.Store(1_700_000_000_000)
	fx, b := startRealClock(t, clk, func(c *Config) { c.LeaseMsMax = 3_600_000 })
	c := fx.dial()
	c.hello(protocol.Hello{})
	c.publish("q", "m1")
	c.publish("q", "m2")
	c.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 2})
	_, d1 := expect[*protocol.Deliver](c)
	_, d2 := expect[*protocol.Deliver](c)
	start := clk.ms.Load()
	if got := deadline(t, b, "q", d1.Offset); got != start+30_000 {
		t.Fatalf("first deadline %d, want now+30s %d", got, start+30_000)
	}

	clk.advance(10 * time.Second)
	wantCodes(t, "extend by tag", c.extend([]uint64{d1.Tag}, 3_600_000, nil), protocol.CodeOK)
	if got, want := deadline(t, b, "q", d1.Offset), clk.ms.Load()+3_600_000; got != want {
		t.Fatalf("deadline after EXTEND %d, want %d", got, want)
	}
	// The new deadline replaces the old one, earlier too.
	clk.advance(time.Second)
	wantCodes(t, "shorten by tag and reference", c.extend([]uint64{d1.Tag}, 5_000, []protocol.LeaseRef{ref(d1)}), protocol.CodeOK)
	if got, want := deadline(t, b, "q", d1.Offset), clk.ms.Load()+5_000; got != want {
		t.Fatalf("deadline after a shorter EXTEND %d, want %d", got, want)
	}
	extended := clk.ms.Load() + 5_000

	// Refusals: nothing changes.
	bad := ref(d1)
	bad.LeaseID++
	wrongEpoch := ref(d1)
	wrongEpoch.Epoch = 1
	for _, tc := range []struct {
		what   string
		tags   []uint64
		ms     int64
		leases []protocol.LeaseRef
		want   []protocol.Code
	}{
		{"extend_ms 0", []uint64{d1.Tag}, 0, nil, []protocol.Code{protocol.CodeBadRequest}},
		{"extend_ms negative", []uint64{d1.Tag}, -1, nil, []protocol.Code{protocol.CodeBadRequest}},
		{"extend_ms above LeaseMsMax", []uint64{d1.Tag}, 3_600_001, nil, []protocol.Code{protocol.CodeBadRequest}},
		{"length mismatch", []uint64{d1.Tag, d2.Tag}, 1000, []protocol.LeaseRef{ref(d1)}, []protocol.Code{protocol.CodeBadRequest, protocol.CodeBadRequest}},
		{"unknown tag", []uint64{999}, 1000, nil, []protocol.Code{protocol.CodeUnknownTag}},
		{"wrong lease id", []uint64{d1.Tag}, 1000, []protocol.LeaseRef{bad}, []protocol.Code{protocol.CodeStaleLease}},
		{"epoch on a single node", []uint64{d1.Tag}, 1000, []protocol.LeaseRef{wrongEpoch}, []protocol.Code{protocol.CodeStaleLease}},
		{"reference only, to a lease that does not exist", []uint64{0}, 1000, []protocol.LeaseRef{bad}, []protocol.Code{protocol.CodeStaleLease}},
	} {
		wantCodes(t, tc.what, c.extend(tc.tags, tc.ms, tc.leases), tc.want...)
	}
	if got := deadline(t, b, "q", d1.Offset); got != extended {
		t.Fatalf("deadline %d after refused EXTENDs, want %d", got, extended)
	}
	id := c.send(0, &protocol.Extend{ExtendMs: 1000})
	expectErr(t, c, id, protocol.CodeBadRequest)
	id = c.send(0, &protocol.Extend{Tags: make([]uint64, SettleBatchMaxDefault+1), ExtendMs: 1000})
	expectErr(t, c, id, protocol.CodeLimitExceeded)

	// NO_REPLY: silence when every tag is ok, an ERROR otherwise.
	c.send(protocol.FlagNoReply, &protocol.Extend{Tags: []uint64{d2.Tag}, ExtendMs: 60_000})
	id = c.send(protocol.FlagNoReply, &protocol.Extend{Tags: []uint64{d2.Tag, 999}, ExtendMs: 60_000})
	expectErr(t, c, id, protocol.CodeUnknownTag)
	id = c.send(protocol.FlagNoReply, &protocol.Extend{Tags: []uint64{d2.Tag}, ExtendMs: 0})
	expectErr(t, c, id, protocol.CodeBadRequest)
	c.ping()
	if got, want := deadline(t, b, "q", d2.Offset), clk.ms.Load()+60_000; got != want {
		t.Fatalf("deadline after NO_REPLY EXTEND %d, want %d", got, want)
	}

	// Another session cannot extend this session's lease by reference.
	other := fx.dial()
	other.hello(protocol.Hello{})
	wantCodes(t, "another session's lease", other.extend([]uint64{0}, 1000, []protocol.LeaseRef{ref(d1)}), protocol.CodeStaleLease)
	if got := deadline(t, b, "q", d1.Offset); got != extended {
		t.Fatalf("deadline %d after another session's EXTEND, want %d", got, extended)
	}

	// Still the same lease: the ACK by tag and reference applies; then the
	// lease is over.
	wantCodes(t, "ack after extend", c.settleRefs(protocol.OpAck, []uint64{d1.Tag}, []protocol.LeaseRef{ref(d1)}), protocol.CodeOK)
	wantCodes(t, "extend after ack", c.extend([]uint64{d1.Tag}, 1000, nil), protocol.CodeStaleLease)
	wantCodes(t, "extend after ack, by reference", c.extend([]uint64{0}, 1000, []protocol.LeaseRef{ref(d1)}), protocol.CodeStaleLease)

	// A NACKed lease is over too, and its redelivery is a new lease.
	// The redelivery may overtake the SETTLE_RESULT.
	codes, got := c.settleAnd(1, protocol.OpNack, d2.Tag)
	wantCodes(t, "nack", codes, protocol.CodeOK)
	if len(got[protocol.OpDeliver]) != 1 {
		t.Fatalf("after the NACK: %v, want one DELIVER", got)
	}
	again := got[protocol.OpDeliver][0].(*protocol.Deliver)
	if again.Offset != d2.Offset || again.Attempt != d2.Attempt+1 {
		t.Fatalf("redelivery %+v of %+v", again, d2)
	}
	wantCodes(t, "extend of the nacked lease", c.extend([]uint64{d2.Tag}, 1000, []protocol.LeaseRef{ref(d2)}), protocol.CodeStaleLease)
	wantCodes(t, "extend of the redelivery", c.extend([]uint64{again.Tag}, 1000, nil), protocol.CodeOK)
}

// TestExtendedLeaseExpiresAtItsNewDeadline: the broker's clock passes the
// first deadline, and the extended lease stays; it passes the extended
// one, and the message is delivered again (attempt 2), after which the
// old lease cannot be extended.
func TestExtendedLeaseExpiresAtItsNewDeadline(t *testing.T) {
	clk := &fakeNow{}
	clk.ms.Store(1_700_000_000_000)
	fx, b := startRealClock(t, clk, nil)
	c := fx.dial()
	c.hello(protocol.Hello{})
	c.publish("q", "m")
	c.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
	_, d := expect[*protocol.Deliver](c)
	wantCodes(t, "extend", c.extend([]uint64{d.Tag}, 120_000, nil), protocol.CodeOK)

	// Past the first deadline (30 s): the partition's next turn finds
	// nothing due; a publish is such a turn.
	clk.advance(60 * time.Second)
	c.publish("q", "later")
	c.ping()
	if got := deadline(t, b, "q", d.Offset); got != 1_700_000_000_000+120_000 {
		t.Fatalf("deadline %d after the first one passed", got)
	}
	wantCodes(t, "extend again", c.extend([]uint64{d.Tag}, 120_000, nil), protocol.CodeOK)
	clk.advance(121 * time.Second)
	// The publish's turn expires the lease; the redelivery and the
	// PUBLISH_OK come in either order.
	c.send(0, &protocol.Publish{Topic: "q", Partition: -1, Body: []byte("wake")})
	got := c.readN(2)
	if len(got[protocol.OpDeliver]) != 1 || len(got[protocol.OpPublishOK]) != 1 {
		t.Fatalf("after the extended deadline: %v, want a DELIVER and a PUBLISH_OK", got)
	}
	again := got[protocol.OpDeliver][0].(*protocol.Deliver)
	if again.Offset != d.Offset || again.Attempt != 2 || again.LeaseID == d.LeaseID {
		t.Fatalf("after the extended deadline got %+v, want offset %d attempt 2", again, d.Offset)
	}
	wantCodes(t, "extend of the expired lease", c.extend([]uint64{d.Tag}, 1000, nil), protocol.CodeStaleLease)
}
