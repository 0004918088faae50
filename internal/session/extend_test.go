package session_test

import (
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/protocol"
)

func extend(t *testing.T, s *session.Session, ms int64, tags []uint64, leases []protocol.LeaseRef) []protocol.Code {
	t.Helper()
	var got []protocol.Code
	s.Extend(tags, leases, ms, func(c []protocol.Code) { got = c })
	if got == nil {
		t.Fatal("extend did not complete")
	}
	return got
}

func wantCodes(t *testing.T, what string, got []protocol.Code, want ...protocol.Code) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: codes %v, want %v", what, got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: codes %v, want %v", what, got, want)
		}
	}
}

// TestExtendKeepsTheLease: an extension leaves the delivery held (tag,
// lease, credit), so the ACK after it applies; a lease the session settled
// or saw end is stale_lease without reaching the broker; bad requests are
// refused per tag.
func TestExtendKeepsTheLease(t *testing.T) {
	fx := newFixture(t, 5000)
	k := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k)
	fx.publish("q", 3)
	subscribe(t, s, k, protocol.Subscribe{Topic: "q", Prefetch: 2})
	ds := delivers(k.take())
	if len(ds) != 2 {
		t.Fatalf("delivered %+v", ds)
	}
	wantCodes(t, "extend", extend(t, s, 1000, []uint64{ds[0].Tag, ds[1].Tag}, nil), protocol.CodeOK, protocol.CodeOK)
	if r, in, _, _ := fx.fake.Counts("q", ""); r != 1 || in != 2 {
		t.Fatalf("after EXTEND ready=%d inflight=%d, want the leases held", r, in)
	}
	if more := delivers(k.take()); len(more) != 0 {
		t.Fatalf("EXTEND freed credit: %+v", more)
	}
	ref := protocol.LeaseRef{SubID: ds[0].SubID, Partition: ds[0].Partition, Offset: ds[0].Offset, LeaseID: ds[0].LeaseID}
	wantCodes(t, "extend by reference", extend(t, s, 1000, []uint64{ds[0].Tag}, []protocol.LeaseRef{ref}), protocol.CodeOK)
	wantCodes(t, "length mismatch", extend(t, s, 1000, []uint64{ds[0].Tag, ds[1].Tag}, []protocol.LeaseRef{ref}),
		protocol.CodeBadRequest, protocol.CodeBadRequest)
	wantCodes(t, "extend_ms 0", extend(t, s, 0, []uint64{ds[0].Tag}, nil), protocol.CodeBadRequest)
	wantCodes(t, "unknown", extend(t, s, 1000, []uint64{0, 99}, nil), protocol.CodeUnknownTag, protocol.CodeUnknownTag)
	wrongEpoch := ref
	wrongEpoch.Epoch = 3
	wantCodes(t, "an epoch on a single node", extend(t, s, 1000, []uint64{ds[0].Tag}, []protocol.LeaseRef{wrongEpoch}), protocol.CodeStaleLease)

	// The ACK after the extensions applies to the same lease.
	if c := settle(t, s, protocol.OpAck, ds[0].Tag); c[0] != protocol.CodeOK {
		t.Fatalf("ack after extend: %v", c)
	}
	wantCodes(t, "extend after ack", extend(t, s, 1000, []uint64{ds[0].Tag}, nil), protocol.CodeStaleLease)
	third := delivers(k.take())
	if len(third) != 1 {
		t.Fatalf("after the ack: %+v", third)
	}
	// A lease that ended without a settle cannot be extended: the message
	// is back in the queue.
	if !fx.fake.ExpireLease("q", "", ds[1].Offset) {
		t.Fatal("not inflight")
	}
	wantCodes(t, "extend of an expired lease", extend(t, s, 1000, []uint64{ds[1].Tag}, nil), protocol.CodeStaleLease)
	if _, _, acked, _ := fx.fake.Counts("q", ""); acked != 1 {
		t.Fatalf("acked %d", acked)
	}
}

// TestExtendMovesTheResendDeadline: a delivery whose lease deadline the
// session keeps for re-sending (a replicated partition's) is re-sent after
// a resume with the extended deadline, not the first one.
func TestExtendMovesTheResendDeadline(t *testing.T) {
	const now = 1_700_000_000_000
	fx := &fixture{t: t, fake: sessiontest.New(), timers: &timers{}}
	reg, err := session.NewRegistry(session.Config{
		Backend: fx.fake, OwnerID: "owner-a", Rand: &counter{}, ReconnectGraceMs: 5000,
		AfterFunc: fx.timers.after, Now: func() time.Time { return time.UnixMilli(now) },
	})
	if err != nil {
		t.Fatal(err)
	}
	fx.reg = reg
	fx.fake.LeaseExpiresAtMs = now + 30_000
	k1 := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k1)
	fx.publish("a", 2)
	subscribe(t, s, k1, protocol.Subscribe{Topic: "a", Prefetch: 2})
	ds := delivers(k1.take())
	if len(ds) != 2 {
		t.Fatalf("delivered %+v", ds)
	}
	wantCodes(t, "extend", extend(t, s, 600_000, []uint64{ds[0].Tag}, nil), protocol.CodeOK)
	s.Detach(k1, nil)
	k2 := &sink{}
	fx.open(s.Identity(), k2)
	s.Resend()
	got := map[uint64]int64{}
	for _, o := range k2.take() {
		if d, ok := o.Body.(*protocol.Deliver); ok {
			got[d.Tag] = o.NotAfterMs
		}
	}
	if got[ds[0].Tag] != now+600_000 || got[ds[1].Tag] != now+30_000 {
		t.Fatalf("re-sent with deadlines %v, want tag %d at %d (extended) and tag %d at %d", got, ds[0].Tag, now+600_000, ds[1].Tag, now+30_000)
	}
}
