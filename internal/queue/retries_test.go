package queue

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
)

// snapshotV1 is a version-1 snapshot written by the queue before releases
// were counted apart, with its dump at 400: offset 1 was released once (then
// counted as a retry) and is leased again, 2 is dead-lettering, 3 inflight,
// 4 ready.
const (
	snapshotV1Hex  = "534e5751010b0403016203646c7101610401030200000400a81401040100a08d060401900301030100c09a0c0302981101010000e0a712d79a41b2"
	snapshotV1Dump = `next-lsn=11 frontier=1 lease-seq=4 ready=1 delayed=0 inflight=2 dead-lettering=1 settled-ranges=2
next-deadline=1100
1: inflight attempt=2 lease=4 owner=b deadline=1300
2: dead_lettering attempt=1 reason=failed target="dlq" at=200 expires=50000
3: inflight attempt=1 lease=3 owner=a deadline=1100 expires=100000
4: ready attempt=0 expires=150000
`
)

// TestRestoreVersion1: a snapshot from before the released count restores
// (every message starts with no uncounted releases) and carries on under the
// new rule, and its own snapshot is written in the current version.
func TestRestoreVersion1(t *testing.T) {
	snap, err := hex.DecodeString(snapshotV1Hex)
	if err != nil {
		t.Fatal(err)
	}
	if snap[len(snapshotMagic)] != 1 {
		t.Fatalf("fixture is version %d", snap[len(snapshotMagic)])
	}
	s, err := Restore(Config{MaxRetries: 1, LeaseMs: 1000}, snap)
	if err != nil {
		t.Fatal(err)
	}
	if got := dump(s, 400); got != snapshotV1Dump {
		t.Fatalf("restored v1 snapshot:\n%s\nwant:\n%s", got, snapshotV1Dump)
	}
	// Offset 1 already used its one retry under the old rule (attempt 2, no
	// uncounted release on record): a release now costs nothing, a NACK
	// after it dead-letters.
	h := &harness{s: s, nextLSN: s.NextLSN()}
	rel, err := s.Release(nil, 1, 4, 400)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, h, rel)
	if rel[0].Kind != KindRequeue || rel[0].Reason != ReasonReleased {
		t.Fatalf("release of a message with no retries left: %s", formatEvent(rel[0]))
	}
	evs := s.Lease(nil, "c", 1, 400)
	mustApply(t, h, evs)
	if evs[0].Offset != 1 || evs[0].Attempt != 3 {
		t.Fatalf("lease after release: %s", formatEvent(evs[0]))
	}
	nack, err := s.Nack(nil, 1, evs[0].LeaseID, 0, 400)
	if err != nil {
		t.Fatal(err)
	}
	if nack[0].Kind != KindDeadLetter || nack[0].Reason != ReasonRetriesExhausted {
		t.Fatalf("nack with no retries left: %s", formatEvent(nack[0]))
	}
	out := s.Snapshot(nil)
	if out[len(snapshotMagic)] != snapshotVersion {
		t.Fatalf("snapshot written as version %d, want %d", out[len(snapshotMagic)], snapshotVersion)
	}
	r, err := Restore(Config{}, out)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dump(r, 400), dump(s, 400); got != want {
		t.Fatalf("v2 round trip:\n%s\nwant:\n%s", got, want)
	}
}

// TestReleasesUncountedMax: after ReleasesUncountedMax free releases a
// release counts like a NACK, so the attempts of a message with a retry
// limit stay within attemptMax.
func TestReleasesUncountedMax(t *testing.T) {
	h := &harness{s: New(Config{MaxRetries: 1, LeaseMs: 1000}), nextLSN: 1}
	enqueueN(t, h, 1, 0)
	// Stand in for ReleasesUncountedMax-1 earlier releases (and as many
	// leases) without running a million commands.
	e := entryOf(h.s, 1)
	e.attempt, e.released = ReleasesUncountedMax-1, ReleasesUncountedMax-1

	cycle := func(release bool) Event {
		t.Helper()
		evs := h.s.Lease(nil, "a", 1, 0)
		mustApply(t, h, evs)
		var back []Event
		var err error
		if release {
			back, err = h.s.Release(nil, evs[0].Offset, evs[0].LeaseID, 0)
		} else {
			back, err = h.s.Nack(nil, evs[0].Offset, evs[0].LeaseID, 0, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, h, back)
		return back[0]
	}
	// The last free release.
	if ev := cycle(true); ev.Kind != KindRequeue {
		t.Fatalf("release %d: %s", ReleasesUncountedMax, formatEvent(ev))
	}
	if in, _ := h.s.Lookup(1, 0); in.Released != ReleasesUncountedMax || in.Attempt != ReleasesUncountedMax {
		t.Fatalf("after the last free release: %s released=%d", formatInfo(in), in.Released)
	}
	// The next release counts: that is the one failed delivery max-retries=1
	// allows; the one after uses up the retry.
	if ev := cycle(true); ev.Kind != KindRequeue {
		t.Fatalf("first counted release: %s", formatEvent(ev))
	}
	if in, _ := h.s.Lookup(1, 0); in.Released != ReleasesUncountedMax {
		t.Fatalf("released count moved past its cap: %d", in.Released)
	}
	if ev := cycle(true); ev.Kind != KindDeadLetter || ev.Reason != ReasonRetriesExhausted {
		t.Fatalf("second counted release: %s", formatEvent(ev))
	}
}

// TestAttemptSaturates: with UnlimitedRetries a message can be delivered
// without end; Attempt stops at attemptMax instead of wrapping, and the
// saturated leases replay and restore.
func TestAttemptSaturates(t *testing.T) {
	h := &harness{s: New(Config{UnlimitedRetries: true, LeaseMs: 1000}), nextLSN: 1}
	enqueueN(t, h, 1, 0)
	e := entryOf(h.s, 1)
	e.attempt = attemptMax - 1
	snap := h.s.Snapshot(nil)
	logStart := len(h.log)
	for i, want := range []uint32{attemptMax, attemptMax, attemptMax} {
		evs := h.s.Lease(nil, "a", 1, 0)
		mustApply(t, h, evs)
		if evs[0].Attempt != want {
			t.Fatalf("lease %d: attempt %d, want %d", i, evs[0].Attempt, want)
		}
		back, err := h.s.Nack(nil, 1, evs[0].LeaseID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if back[0].Kind != KindRequeue {
			t.Fatalf("nack with unlimited retries: %s", formatEvent(back[0]))
		}
		mustApply(t, h, back)
	}
	r, err := Restore(Config{UnlimitedRetries: true}, snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := replay(r, h.log[logStart:]); err != nil {
		t.Fatal(err)
	}
	if got, want := dump(r, 0), dump(h.s, 0); got != want {
		t.Fatalf("replay of saturated leases:\n%s\nwant:\n%s", got, want)
	}
	// A lease event that goes past the cap is corrupt.
	evs := h.s.Lease(nil, "a", 1, 0)
	evs[0].Attempt = attemptMax + 1
	if err := h.s.Apply(h.nextLSN, evs[0]); err == nil {
		t.Fatal("lease with attempt beyond attemptMax applied")
	}
}

// TestSnapshotV3RestoresWithoutEndedLease: a version 3 checkpoint has no
// ended leases, so it restores with none (a late ack of a lease that ended
// before it is stale); the same entry in version 4 carries its ended lease.
func TestSnapshotV3RestoresWithoutEndedLease(t *testing.T) {
	build := func(ver byte, tail ...byte) []byte {
		b := append([]byte(snapshotMagic), ver)
		b = append(b, 3, 1, 0, 1) // next lsn 3, lease seq 1, no strings, one entry
		b = append(b, 1, snapQueued, 1, 0, 0, 0)
		b = append(b, tail...) // version 4: ended lease
		b = append(b, 0)       // no moved bodies
		return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	}
	s3, err := Restore(Config{}, build(3))
	if err != nil {
		t.Fatal(err)
	}
	if got := dump(s3, 0); !strings.Contains(got, "1: ready attempt=1\n") {
		t.Fatalf("v3 restore:\n%s", got)
	}
	if _, err := s3.Ack(nil, 1, 1); !errors.Is(err, ErrStaleLease) {
		t.Fatalf("ack of a lease ended before a v3 checkpoint: %v", err)
	}
	s4, err := Restore(Config{}, build(4, 1))
	if err != nil {
		t.Fatal(err)
	}
	if got := dump(s4, 0); !strings.Contains(got, "1: ready attempt=1 ended-lease=1\n") {
		t.Fatalf("v4 restore:\n%s", got)
	}
	if evs, err := s4.Ack(nil, 1, 1); err != nil || len(evs) != 1 || evs[0].Kind != KindAck {
		t.Fatalf("late ack after a v4 restore: %v %v", evs, err)
	}
	// An ended lease above the lease counter is corrupt.
	if _, err := Restore(Config{}, build(4, 2)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ended lease above the counter: %v", err)
	}
}
