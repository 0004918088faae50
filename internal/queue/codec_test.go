package queue

import (
	"errors"
	"testing"
)

// sampleEvents has one event of every kind with every encoded field set.
func sampleEvents() []Event {
	return []Event{
		{Kind: KindEnqueue, Msg: &Message{
			Key:         []byte("order-17"),
			Headers:     []Header{{"trace", "abc"}, {"", ""}, {"k", "v"}},
			ContentType: "application/json",
			NotBeforeMs: 1_700_000_000_500, ExpiresAtMs: 1_700_000_060_000, PublishedAtMs: 1_700_000_000_000,
			ProducerID: "p-1", ProducerSeq: 1 << 40,
			Body: []byte(`{"id":17}`),
		}},
		{Kind: KindEnqueue, Msg: &Message{}},
		{Kind: KindLease, Offset: 12, LeaseID: 99, Owner: "consumer-a", DeadlineMs: 1_700_000_030_000, Attempt: 3, AtMs: 1_700_000_000_000},
		{Kind: KindAck, Offset: 1 << 50, LeaseID: 1},
		{Kind: KindRequeue, Offset: 5, LeaseID: 7, Reason: ReasonNack, NotBeforeMs: 1_700_000_001_000, AtMs: 1_700_000_000_000},
		{Kind: KindRequeue, Offset: 5, LeaseID: 8, Reason: ReasonLeaseExpired, AtMs: -1},
		{Kind: KindDeadLetter, Offset: 6, LeaseID: 0, Reason: ReasonExpired, Target: "dlq", AtMs: 10},
		{Kind: KindDeadLetter, Offset: 6, LeaseID: 3, Reason: ReasonFailed, AtMs: 10},
		{Kind: KindDeadLetterDone, Offset: 6, AtMs: 11},
		{Kind: KindRelocate, Offset: 1 << 33, Msg: &Message{
			Key: []byte("k"), Headers: []Header{{"a", "b"}}, ContentType: "text/plain",
			NotBeforeMs: 1_700_000_000_500, PublishedAtMs: 1_700_000_000_000, Body: []byte("moved"),
		}},
		{Kind: KindRelocate, Offset: 3, Msg: &Message{}},
		{Kind: KindExtend, Offset: 12, LeaseID: 99, DeadlineMs: 1_700_000_090_000, AtMs: 1_700_000_000_000},
		{Kind: KindExtend, Offset: 1 << 60, LeaseID: 1<<64 - 1, DeadlineMs: -5, AtMs: 1 << 62},
		{Kind: KindAssign, Target: "billing", Owner: "worker-1", Epoch: 7, AtMs: 1_700_000_000_000},
		{Kind: KindAssign, Epoch: 1 << 63},
	}
}

func TestEventRoundTrip(t *testing.T) {
	for _, ev := range sampleEvents() {
		b := ev.Marshal(nil)
		got, err := DecodeEvent(uint8(ev.Kind), b)
		if err != nil {
			t.Fatalf("%s: %v", formatEvent(ev), err)
		}
		if !eventsEqual(ev, got) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, ev)
		}
	}
}

func TestDecodeEventRejects(t *testing.T) {
	for _, ev := range sampleEvents() {
		b := ev.Marshal(nil)
		// Every strict prefix is truncated somewhere.
		for n := range len(b) {
			if _, err := DecodeEvent(uint8(ev.Kind), b[:n]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%v truncated to %d of %d bytes: err %v", ev.Kind, n, len(b), err)
			}
		}
		if _, err := DecodeEvent(uint8(ev.Kind), append(b, 0)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%v with a trailing byte: err %v", ev.Kind, err)
		}
		bad := append([]byte{}, b...)
		bad[0] = eventVersion + 1
		if _, err := DecodeEvent(uint8(ev.Kind), bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%v with version %d: err %v", ev.Kind, bad[0], err)
		}
	}
	for _, kind := range []uint8{0, uint8(kindEnd), 255} {
		if _, err := DecodeEvent(kind, []byte{eventVersion}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("kind %d: err %v", kind, err)
		}
	}
	// A requeue may not carry a dead-letter reason and vice versa.
	rq := (&Event{Kind: KindRequeue, Offset: 1, LeaseID: 1, Reason: ReasonFailed}).Marshal(nil)
	if _, err := DecodeEvent(uint8(KindRequeue), rq); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("requeue with reason failed: err %v", err)
	}
	dl := (&Event{Kind: KindDeadLetter, Offset: 1, Reason: ReasonNack}).Marshal(nil)
	if _, err := DecodeEvent(uint8(KindDeadLetter), dl); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("dead letter with reason nack: err %v", err)
	}
	// A header count far beyond the payload must fail before allocating.
	huge := []byte{eventVersion, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}
	if _, err := DecodeEvent(uint8(KindEnqueue), huge); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("huge header count: err %v", err)
	}
}

// FuzzDecodeEvent: no input panics, and whatever decodes re-encodes to a
// payload that decodes to the same event.
func FuzzDecodeEvent(f *testing.F) {
	for _, ev := range sampleEvents() {
		f.Add(uint8(ev.Kind), ev.Marshal(nil))
	}
	f.Add(uint8(0), []byte{})
	f.Fuzz(func(t *testing.T, kind uint8, b []byte) {
		ev, err := DecodeEvent(kind, b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		again, err := DecodeEvent(kind, ev.Marshal(nil))
		if err != nil {
			t.Fatalf("re-encoded event does not decode: %v", err)
		}
		if !eventsEqual(ev, again) {
			t.Fatalf("re-encoded event differs:\n%+v\n%+v", ev, again)
		}
	})
}
