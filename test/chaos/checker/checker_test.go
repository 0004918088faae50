package checker

import (
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func id(p string, s uint64) ID { return ID{Producer: p, Seq: s} }

// at is the position every test message is stored at unless a test says otherwise.
var at0 = Pos{Partition: 0, Offset: 7}

func TestCleanRun(t *testing.T) {
	c := New()
	for s := uint64(1); s <= 3; s++ {
		c.Attempted(id("p", s))
		c.Confirmed(id("p", s))
		c.Delivered(id("p", s), at0, int64(10*s))
		c.Settled(id("p", s), at0)
	}
	r := c.Report()
	if err := r.Err(); err != nil {
		t.Fatalf("clean run reported %v", err)
	}
	want := Report{Attempted: 3, Confirmed: 3, Deliveries: 3, Delivered: 3, Settled: 3,
		LongestGapMs: 10, LongestGapAtMs: 10, FirstDeliveryMs: 10, LastDeliveryMs: 30}
	if r.String() != want.String() || r.LongestGapAtMs != 10 || r.FirstDeliveryMs != 10 || r.LastDeliveryMs != 30 {
		t.Fatalf("report\n got %+v\nwant %+v", r, want)
	}
	if c.Outstanding() != 0 {
		t.Fatalf("outstanding = %d, want 0", c.Outstanding())
	}
}

func TestLost(t *testing.T) {
	c := New()
	for s := uint64(1); s <= 10; s++ {
		c.Confirmed(id("p0", s))
	}
	c.Confirmed(id("p1", 4))
	for _, s := range []uint64{1, 2, 8} {
		c.Delivered(id("p0", s), at0, 0)
	}
	r := c.Report()
	err := r.Err()
	if !errors.Is(err, ErrViolation) {
		t.Fatalf("Err() = %v, want ErrViolation", err)
	}
	if got, want := FormatIDs(r.Lost), "p0:[3-7,9-10] p1:[4]"; got != want {
		t.Fatalf("lost = %q, want %q", got, want)
	}
	if !strings.Contains(err.Error(), "lost (confirmed, never delivered): 8: p0:[3-7,9-10] p1:[4]") {
		t.Fatalf("message does not name the lost sequences: %v", err)
	}
	if c.Outstanding() != 11 {
		t.Fatalf("outstanding = %d, want 11", c.Outstanding())
	}
}

func TestUnconfirmedMayVanishOrArrive(t *testing.T) {
	c := New()
	c.Attempted(id("p", 1)) // never confirmed, never delivered: fine
	c.Attempted(id("p", 2)) // never confirmed, delivered anyway: fine
	c.Delivered(id("p", 2), at0, 5)
	r := c.Report()
	if err := r.Err(); err != nil {
		t.Fatalf("unconfirmed publishes must not be violations: %v", err)
	}
	if r.Attempted != 2 || r.Confirmed != 0 || r.Delivered != 1 {
		t.Fatalf("report %v", r)
	}
}

func TestSettledRedelivered(t *testing.T) {
	c := New()
	c.Confirmed(id("p", 1))
	c.Confirmed(id("p", 2))
	c.Delivered(id("p", 1), at0, 1)
	c.Delivered(id("p", 1), at0, 2) // redelivered before any ack: a duplicate, legal
	c.Settled(id("p", 1), at0)
	c.DeliveredAttempt(id("p", 2), at0, 3, 1)
	c.SettledAt(id("p", 2), at0, 5)
	c.DeliveredAttempt(id("p", 2), at0, 7, 2) // after the confirmed ack: a violation
	r := c.Report()
	if got := FormatIDs(r.SettledRedelivered); got != "p:[2]" {
		t.Fatalf("settled-redelivered = %q, want p:[2]", got)
	}
	if r.Duplicates != 2 {
		t.Fatalf("duplicates = %d, want 2", r.Duplicates)
	}
	if err := r.Err(); !errors.Is(err, ErrViolation) || !strings.Contains(err.Error(), "settled-redelivered") {
		t.Fatalf("Err() = %v", err)
	}
	// The report says where and when, for finding it in the broker's logs.
	want := "delivered t=3ms attempt=1, settled t=5ms, delivered t=7ms attempt=2"
	if err := r.Err(); !strings.Contains(err.Error(), want) {
		t.Fatalf("Err() = %v\nwant the trace %q", err, want)
	}
}

func TestPhantomAndCorrupt(t *testing.T) {
	c := New()
	c.Delivered(id("ghost", 9), at0, 1)
	c.Corrupt("partition 0 offset 7: crc mismatch", 2)
	r := c.Report()
	if FormatIDs(r.Phantom) != "ghost:[9]" || len(r.Corrupt) != 1 || r.Deliveries != 2 {
		t.Fatalf("report %+v", r)
	}
	msg := r.Err().Error()
	for _, want := range []string{"phantom", "ghost:[9]", "corrupt bodies: 1", "offset 7"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("message %q lacks %q", msg, want)
		}
	}
}

func TestGapIgnoresOutOfOrderTimestamps(t *testing.T) {
	c := New()
	for _, at := range []int64{100, 150, 140, 900, 880, 1000} {
		c.Delivered(id("p", uint64(at)), at0, at)
	}
	r := c.Report()
	if r.LongestGapMs != 750 || r.LongestGapAtMs != 150 || r.FirstDeliveryMs != 100 || r.LastDeliveryMs != 1000 {
		t.Fatalf("gap %d at %d, first %d last %d; want 750 at 150, 100..1000",
			r.LongestGapMs, r.LongestGapAtMs, r.FirstDeliveryMs, r.LastDeliveryMs)
	}
}

func TestFormatIDsBounded(t *testing.T) {
	var ids []ID
	for s := uint64(0); s < 3*idsShownMax; s += 2 {
		ids = append(ids, id("p", s))
	}
	got := FormatIDs(ids)
	if !strings.HasSuffix(got, ",...]") || strings.Count(got, ",") != idsShownMax {
		t.Fatalf("FormatIDs of %d sparse ids = %q", len(ids), got)
	}
	if FormatIDs(nil) != "" {
		t.Fatalf("FormatIDs(nil) = %q", FormatIDs(nil))
	}
}

// TestCheckerAgainstModel drives the checker with random event sequences and
// compares its verdict with a direct recomputation from the event list.
func TestCheckerAgainstModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		type ev struct {
			kind int // 0 attempted, 1 confirmed, 2 delivered, 3 settled
			seq  uint64
		}
		evs := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) ev {
			return ev{rapid.IntRange(0, 3).Draw(t, "kind"), rapid.Uint64Range(0, 5).Draw(t, "seq")}
		}), 0, 60).Draw(t, "events")
		c := New()
		for i, e := range evs {
			switch e.kind {
			case 0:
				c.Attempted(id("p", e.seq))
			case 1:
				c.Confirmed(id("p", e.seq))
			case 2:
				c.Delivered(id("p", e.seq), at0, int64(i))
			case 3:
				c.Settled(id("p", e.seq), at0)
			}
		}
		r := c.Report()
		for s := uint64(0); s <= 5; s++ {
			var attempted, confirmed, settled, redelivered bool
			deliveries := 0
			for _, e := range evs {
				if e.seq != s {
					continue
				}
				switch e.kind {
				case 0:
					attempted = true
				case 1:
					attempted, confirmed = true, true
				case 2:
					deliveries++
					redelivered = redelivered || settled
				case 3:
					settled = true
				}
			}
			if got := contains(r.Lost, s); got != (confirmed && deliveries == 0) {
				t.Fatalf("seq %d: lost=%v, model says %v", s, got, !got)
			}
			if got := contains(r.SettledRedelivered, s); got != redelivered {
				t.Fatalf("seq %d: settled-redelivered=%v, model says %v", s, got, !got)
			}
			if got := contains(r.Phantom, s); got != (deliveries > 0 && !attempted) {
				t.Fatalf("seq %d: phantom=%v, model says %v", s, got, !got)
			}
		}
		if r.Deliveries != r.Delivered+r.Duplicates {
			t.Fatalf("deliveries %d != delivered %d + duplicates %d", r.Deliveries, r.Delivered, r.Duplicates)
		}
	})
}

func contains(ids []ID, s uint64) bool {
	for _, x := range ids {
		if x.Seq == s {
			return true
		}
	}
	return false
}

func TestAckInDoubtStopsWaitingOnlyAfterDelivery(t *testing.T) {
	c := New()
	c.Confirmed(id("p", 1))
	c.AckInDoubt(id("p", 1)) // not delivered yet: still outstanding
	if c.Outstanding() != 1 {
		t.Fatalf("outstanding = %d, want 1", c.Outstanding())
	}
	c.Delivered(id("p", 1), at0, 0)
	if c.Outstanding() != 0 {
		t.Fatalf("outstanding = %d, want 0", c.Outstanding())
	}
	c.Delivered(id("p", 1), at0, 1) // coming back after an ack in doubt is legal
	r := c.Report()
	if r.Err() != nil || r.Unsettled != 1 || r.InDoubt != 1 || r.Duplicates != 1 {
		t.Fatalf("report %s, err %v", r, r.Err())
	}
}

func TestDedupMissIsNotASettledRedelivery(t *testing.T) {
	c := New()
	c.Confirmed(id("p", 1))
	c.Delivered(id("p", 1), Pos{0, 10}, 1)
	c.Settled(id("p", 1), Pos{0, 10})
	// The same producer sequence stored again at another offset: a duplicate
	// publish, not the settled record coming back.
	c.Delivered(id("p", 1), Pos{1, 3}, 2)
	r := c.Report()
	if r.Err() != nil || r.DedupMisses != 1 || r.Duplicates != 1 {
		t.Fatalf("report %s, err %v", r, r.Err())
	}
	c.Delivered(id("p", 1), Pos{0, 10}, 3) // the settled position itself: a violation
	if r := c.Report(); FormatIDs(r.SettledRedelivered) != "p:[1]" {
		t.Fatalf("settled-redelivered = %q", FormatIDs(r.SettledRedelivered))
	}
}

// TestOutstandingAgainstModel checks the count Outstanding keeps against a
// recount over every message after each record, including acks in doubt
// before and after a delivery and records of messages never confirmed.
func TestOutstandingAgainstModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		type model struct {
			confirmed, settled, inDoubt bool
			deliveries                  int
		}
		const seqs = 6
		var ms [seqs]model
		c := New()
		n := rapid.IntRange(0, 80).Draw(t, "records")
		for i := range n {
			s := rapid.Uint64Range(0, seqs-1).Draw(t, "seq")
			m := &ms[s]
			switch rapid.IntRange(0, 4).Draw(t, "kind") {
			case 0:
				c.Attempted(id("p", s))
			case 1:
				c.Confirmed(id("p", s))
				m.confirmed = true
			case 2:
				c.Delivered(id("p", s), at0, int64(i))
				m.deliveries++
			case 3:
				c.Settled(id("p", s), at0)
				m.settled = true
			case 4:
				c.AckInDoubt(id("p", s))
				m.inDoubt = true
			}
			want := 0
			for _, m := range ms {
				if m.confirmed && !m.settled && !(m.inDoubt && m.deliveries > 0) {
					want++
				}
			}
			if got := c.Outstanding(); got != want {
				t.Fatalf("after record %d: outstanding = %d, model says %d", i, got, want)
			}
		}
	})
}

// BenchmarkOutstanding measures the drain poll on a run the size of a long
// chaos scenario (400k confirmed messages, a quarter unsettled). The poll
// holds the lock every consumer records under, so it must not grow with
// the run.
func BenchmarkOutstanding(b *testing.B) {
	c := New()
	const msgs = 400_000
	for i := range uint64(msgs) {
		c.Confirmed(id("p", i))
		if i%4 != 0 {
			c.Delivered(id("p", i), Pos{Offset: i}, 0)
			c.Settled(id("p", i), Pos{Offset: i})
		}
	}
	if got := c.Outstanding(); got != msgs/4 {
		b.Fatalf("outstanding = %d, want %d", got, msgs/4)
	}
	for b.Loop() {
		c.Outstanding()
	}
}

// The report names the attempt of the delivery that ended the longest gap:
// a message delivered again (attempt 2) once its lease ran out, here.
func TestGapNamesTheAttemptThatEndedIt(t *testing.T) {
	c := New()
	c.DeliveredAttempt(id("p", 1), at0, 100, 1)
	c.DeliveredAttempt(id("p", 2), at0, 200, 1)
	c.DeliveredAttempt(id("p", 1), at0, 30200, 2)
	c.DeliveredAttempt(id("p", 3), at0, 30300, 1)
	if r := c.Report(); r.LongestGapMs != 30000 || r.LongestGapAtMs != 200 || r.LongestGapEndAttempt != 2 {
		t.Fatalf("gap %d at %d ended by attempt %d; want 30000 at 200 ended by attempt 2",
			r.LongestGapMs, r.LongestGapAtMs, r.LongestGapEndAttempt)
	}
}
