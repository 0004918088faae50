package queue

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
)

// record is one entry of the fake log a harness keeps: what the partition
// would have written to seglog.
type record struct {
	lsn     uint64
	kind    uint8
	payload []byte
}

// harness plays the partition actor: it encodes every event, "appends" it to
// an in-memory log under the next LSN, decodes it back and applies the
// decoded copy, so every test also exercises the codec on real traffic.
type harness struct {
	s       *State
	log     []record
	nextLSN uint64
}

// gapKind marks a record that is not a queue event (a raft no-op): the
// harness applies it with ApplyGap.
const gapKind = 0xff

// gap appends a record that is not a queue event and applies it.
func (h *harness) gap() (uint64, error) {
	lsn := h.nextLSN
	h.nextLSN++
	h.log = append(h.log, record{lsn: lsn, kind: gapKind})
	return lsn, h.s.ApplyGap(lsn)
}

// apply appends and applies evs in order and returns the LSNs they got.
func (h *harness) apply(evs []Event) ([]uint64, error) {
	lsns := make([]uint64, 0, len(evs))
	for i := range evs {
		ev := &evs[i]
		payload := ev.Marshal(nil)
		dec, err := DecodeEvent(uint8(ev.Kind), payload)
		if err != nil {
			return lsns, fmt.Errorf("decode own %v event: %w", ev.Kind, err)
		}
		if again := dec.Marshal(nil); !bytes.Equal(again, payload) {
			return lsns, fmt.Errorf("%v event does not round-trip: %x vs %x", ev.Kind, payload, again)
		}
		if !eventsEqual(*ev, dec) {
			return lsns, fmt.Errorf("%v event decodes differently:\n%+v\n%+v", ev.Kind, *ev, dec)
		}
		lsn := h.nextLSN
		h.nextLSN++
		h.log = append(h.log, record{lsn: lsn, kind: uint8(ev.Kind), payload: payload})
		if err := h.s.Apply(lsn, dec); err != nil {
			return lsns, err
		}
		lsns = append(lsns, lsn)
	}
	return lsns, nil
}

// replay applies every record of log to s.
func replay(s *State, log []record) error {
	for _, r := range log {
		if r.kind == gapKind {
			if err := s.ApplyGap(r.lsn); err != nil {
				return err
			}
			continue
		}
		ev, err := DecodeEvent(r.kind, r.payload)
		if err != nil {
			return err
		}
		if err := s.Apply(r.lsn, ev); err != nil {
			return err
		}
	}
	return nil
}

// eventsEqual compares events, messages by value, treating nil and empty
// byte slices alike (the codec does not distinguish them).
func eventsEqual(a, b Event) bool {
	am, bm := a.Msg, b.Msg
	a.Msg, b.Msg = nil, nil
	if !reflect.DeepEqual(a, b) {
		return false
	}
	if (am == nil) != (bm == nil) {
		return false
	}
	if am == nil {
		return true
	}
	x, y := *am, *bm
	if !bytes.Equal(x.Key, y.Key) || !bytes.Equal(x.Body, y.Body) || len(x.Headers) != len(y.Headers) {
		return false
	}
	for i := range x.Headers {
		if x.Headers[i] != y.Headers[i] {
			return false
		}
	}
	x.Key, y.Key, x.Body, y.Body, x.Headers, y.Headers = nil, nil, nil, nil, nil, nil
	return reflect.DeepEqual(x, y)
}

// formatEvent renders an event the way scenario traces show it.
func formatEvent(ev Event) string {
	var b strings.Builder
	b.WriteString(ev.Kind.String())
	switch ev.Kind {
	case KindEnqueue:
		m := ev.Msg
		if m.NotBeforeMs != 0 {
			fmt.Fprintf(&b, " not-before=%d", m.NotBeforeMs)
		}
		if m.ExpiresAtMs != 0 {
			fmt.Fprintf(&b, " expires=%d", m.ExpiresAtMs)
		}
	case KindLease:
		fmt.Fprintf(&b, " offset=%d lease=%d owner=%s attempt=%d deadline=%d", ev.Offset, ev.LeaseID, ev.Owner, ev.Attempt, ev.DeadlineMs)
	case KindAck:
		fmt.Fprintf(&b, " offset=%d lease=%d", ev.Offset, ev.LeaseID)
	case KindRequeue:
		fmt.Fprintf(&b, " offset=%d lease=%d reason=%v", ev.Offset, ev.LeaseID, ev.Reason)
		if ev.NotBeforeMs != 0 {
			fmt.Fprintf(&b, " not-before=%d", ev.NotBeforeMs)
		}
	case KindDeadLetter:
		fmt.Fprintf(&b, " offset=%d lease=%d reason=%v target=%q", ev.Offset, ev.LeaseID, ev.Reason, ev.Target)
	case KindDeadLetterDone, KindRelocate:
		fmt.Fprintf(&b, " offset=%d", ev.Offset)
	case KindExtend:
		fmt.Fprintf(&b, " offset=%d lease=%d deadline=%d", ev.Offset, ev.LeaseID, ev.DeadlineMs)
	case KindAssign:
		fmt.Fprintf(&b, " cohort=%q member=%q epoch=%d", ev.Target, ev.Owner, ev.Epoch)
	}
	return b.String()
}

// dump is a canonical rendering of everything observable about s at nowMs:
// two states with equal dumps are indistinguishable to the partition.
func dump(s *State, nowMs int64) string {
	var b strings.Builder
	st := s.Stats(nowMs)
	fmt.Fprintf(&b, "next-lsn=%d frontier=%d lease-seq=%d ready=%d delayed=%d inflight=%d dead-lettering=%d settled-ranges=%d\n",
		st.NextLSN, st.Frontier, s.leaseSeq, st.Ready, st.Delayed, st.Inflight, st.DeadLettering, st.SettledRanges)
	if at, ok := s.NextDeadlineMs(); ok {
		fmt.Fprintf(&b, "next-deadline=%d\n", at)
	}
	if g := s.Gate(); g != (Gate{}) {
		fmt.Fprintf(&b, "gate cohort=%q member=%q epoch=%d\n", g.Cohort, g.Member, g.Epoch)
	}
	// Walk the unsettled offsets only: a restored state may span a huge LSN
	// range. The model test checks Lookup of every single offset instead.
	for off := range s.bits.from(0, anyLive) {
		in, ok := s.Lookup(off, nowMs)
		if !ok || in.State == StateSettled {
			continue
		}
		b.WriteString(formatInfo(in))
		if at := s.BodyLSN(off); at != off {
			fmt.Fprintf(&b, " body=%d", at)
		}
		b.WriteByte('\n')
	}
	if len(s.moved) > 0 {
		fmt.Fprintf(&b, "body-floor=%d\n", s.BodyFloor())
	}
	return b.String()
}

func formatInfo(in Info) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d: %v attempt=%d", in.Offset, in.State, in.Attempt)
	if in.Released != 0 {
		fmt.Fprintf(&b, " released=%d", in.Released)
	}
	switch in.State {
	case StateInflight:
		fmt.Fprintf(&b, " lease=%d owner=%s deadline=%d", in.LeaseID, in.Owner, in.DeadlineMs)
	case StateDeadLettering:
		fmt.Fprintf(&b, " reason=%v target=%q at=%d", in.Reason, in.Target, in.DeadlineMs)
	}
	if in.EndedLeaseID != 0 {
		fmt.Fprintf(&b, " ended-lease=%d", in.EndedLeaseID)
	}
	if in.NotBeforeMs != 0 {
		fmt.Fprintf(&b, " not-before=%d", in.NotBeforeMs)
	}
	if in.ExpiresAtMs != 0 {
		fmt.Fprintf(&b, " expires=%d", in.ExpiresAtMs)
	}
	return b.String()
}

// entryOf returns the entry of the unsettled message at off, moving a plain
// message into the slab first, so a test can set fields that no short
// command sequence reaches.
func entryOf(s *State, off uint64) *entry {
	pos, e, _ := s.get(off)
	if pos < 0 {
		pos, e = s.materialize(off)
		s.counts[phaseReady]--
		s.enterQueued(pos, e, 0, 0)
	}
	return e
}
