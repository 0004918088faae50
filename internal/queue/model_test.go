package queue

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// mmsg is the model's view of one unsettled message. Ready and delayed are
// one "queued" state here; which of the two is decided by comparing
// notBefore with the clock, exactly as the specification says.
type mmsg struct {
	state     MsgState // StateReady (meaning queued), StateInflight or StateDeadLettering
	attempt   uint32
	released  uint32 // deliveries that ended in an uncounted release
	leaseID   uint64
	ended     uint64 // queued: the lease that ended without a settle, not followed by another
	owner     string
	deadline  int64
	notBefore int64
	expires   int64
	reason    Reason
	target    string
	dlAt      int64
}

// model is the trivially correct reference: a map of unsettled messages and
// linear scans for everything.
type model struct {
	cfg      Config
	next     uint64
	leaseSeq uint64
	msgs     map[uint64]*mmsg
	// body maps offsets to the LSN of the Relocate record that last
	// copied their body; only offsets still in msgs count.
	body map[uint64]uint64
	// gate: who may lease (see Gate).
	gate Gate
}

// bodyLSN is where the body of offset lives.
func (m *model) bodyLSN(off uint64) uint64 {
	if _, ok := m.msgs[off]; ok {
		if at, ok := m.body[off]; ok {
			return at
		}
	}
	return off
}

// bodies lists every unsettled message's body location, lowest LSN first.
func (m *model) bodies() []BodyLoc {
	var out []BodyLoc
	for off := range m.msgs {
		out = append(out, BodyLoc{Offset: off, LSN: m.bodyLSN(off)})
	}
	slices.SortFunc(out, func(a, b BodyLoc) int { return cmpU64(a.LSN, b.LSN) })
	return out
}

func (m *model) sortedOffsets() []uint64 {
	offs := make([]uint64, 0, len(m.msgs))
	for off := range m.msgs {
		offs = append(offs, off)
	}
	slices.Sort(offs)
	return offs
}

func (m *model) deadLetter(off, lease uint64, r Reason, now int64) Event {
	return Event{Kind: KindDeadLetter, Offset: off, LeaseID: lease, Reason: r, Target: m.cfg.DeadLetter.Target, AtMs: now}
}

func (m *model) enqueue(msg *Message, now int64) Event {
	c := *msg
	if c.PublishedAtMs == 0 {
		c.PublishedAtMs = now
	}
	if c.ExpiresAtMs == 0 && m.cfg.DefaultTTLMs > 0 {
		c.ExpiresAtMs = c.PublishedAtMs + m.cfg.DefaultTTLMs
	}
	return Event{Kind: KindEnqueue, Msg: &c}
}

func (m *model) lease(owner, cohort, member string, max int, now int64) []Event {
	var out []Event
	if !m.gate.Admits(cohort, member) {
		return nil
	}
	// Under a member nothing passes a message waiting out a retry delay.
	barrier, barred := uint64(0), false
	for _, off := range m.sortedOffsets() {
		if x := m.msgs[off]; cohort != "" && x.state == StateReady && x.notBefore > now && x.attempt > 0 {
			barrier, barred = off, true
			break
		}
	}
	leased, expired := 0, 0
	for _, off := range m.sortedOffsets() {
		if leased == max || expired == leaseExpiredScanMax || barred && off > barrier {
			break
		}
		x := m.msgs[off]
		if x.state != StateReady || x.notBefore > now {
			continue
		}
		if m.expired(x, now) {
			expired++
			out = append(out, m.deadLetter(off, 0, ReasonExpired, now))
			continue
		}
		leased++
		out = append(out, Event{Kind: KindLease, Offset: off, LeaseID: m.leaseSeq + uint64(leased), Owner: owner,
			DeadlineMs: now + m.cfg.LeaseMs, Attempt: min(x.attempt+1, attemptMax), AtMs: now})
	}
	return out
}

// expired: the TTL has passed, and the queue enforces TTLs (a Keep queue
// does not).
func (m *model) expired(x *mmsg, now int64) bool {
	return x.expires > 0 && x.expires <= now && !m.cfg.DeadLetter.Keep
}

// requeue is the retry rule in its plainest form: a release is free (up to
// ReleasesUncountedMax of them), anything else uses up a retry, and the
// deliveries that used one are the attempts minus the free releases.
func (m *model) requeue(off uint64, x *mmsg, r Reason, notBefore, now int64) Event {
	free := r == ReasonReleased && x.released < ReleasesUncountedMax
	if !free && !m.cfg.UnlimitedRetries && int(x.attempt)-int(x.released) >= max(m.cfg.MaxRetries, 0)+1 {
		return m.deadLetter(off, x.leaseID, ReasonRetriesExhausted, now)
	}
	if m.expired(x, now) {
		return m.deadLetter(off, x.leaseID, ReasonExpired, now)
	}
	if notBefore <= now {
		notBefore = 0
	}
	return Event{Kind: KindRequeue, Offset: off, LeaseID: x.leaseID, Reason: r, NotBeforeMs: notBefore, AtMs: now}
}

// ended: the queued message whose last lease, lease, ended without a settle.
func (m *model) ended(off, lease uint64) (*mmsg, bool) {
	x, ok := m.msgs[off]
	if !ok || x.state != StateReady || lease == 0 || x.ended != lease {
		return nil, false
	}
	return x, true
}

// leased returns the message under (off, lease) or the error class.
func (m *model) leased(off, lease uint64) (*mmsg, error) {
	if off >= m.next {
		return nil, ErrUnknownOffset
	}
	x, ok := m.msgs[off]
	if !ok {
		return nil, ErrAlreadySettled
	}
	if x.state != StateInflight || x.leaseID != lease {
		return nil, ErrStaleLease
	}
	return x, nil
}

func (m *model) tick(now int64) []Event {
	type due struct {
		at  int64
		off uint64
	}
	var exp, ttl []due
	for off, x := range m.msgs {
		if x.state == StateInflight && x.deadline <= now {
			exp = append(exp, due{x.deadline, off})
		}
		if x.state == StateReady && m.expired(x, now) {
			ttl = append(ttl, due{x.expires, off})
		}
	}
	byTime := func(a, b due) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return cmpU64(a.off, b.off)
	}
	slices.SortFunc(exp, byTime)
	slices.SortFunc(ttl, byTime)
	var out []Event
	for _, d := range exp {
		out = append(out, m.requeue(d.off, m.msgs[d.off], ReasonLeaseExpired, 0, now))
	}
	for _, d := range ttl {
		out = append(out, m.deadLetter(d.off, 0, ReasonExpired, now))
	}
	return out
}

// apply folds ev at lsn into the model, failing on anything the
// specification forbids.
func (m *model) apply(lsn uint64, ev Event) error {
	if lsn < m.next {
		return fmt.Errorf("model: lsn %d below next %d", lsn, m.next)
	}
	m.next = lsn + 1
	if ev.Kind == KindAssign {
		for off, x := range m.msgs {
			if x.state == StateInflight {
				return fmt.Errorf("model: assign with offset %d inflight", off)
			}
		}
		if ev.Epoch != m.gate.Epoch+1 {
			return fmt.Errorf("model: assign epoch %d after %d", ev.Epoch, m.gate.Epoch)
		}
		m.gate = Gate{Cohort: ev.Target, Member: ev.Owner, Epoch: ev.Epoch}
		for _, x := range m.msgs {
			x.ended = 0 // late settles of earlier assignments are stale
		}
		return nil
	}
	if ev.Kind == KindEnqueue {
		m.msgs[lsn] = &mmsg{state: StateReady, notBefore: ev.Msg.NotBeforeMs, expires: ev.Msg.ExpiresAtMs}
		return nil
	}
	x, ok := m.msgs[ev.Offset]
	if !ok {
		return fmt.Errorf("model: %v of settled offset %d", ev.Kind, ev.Offset)
	}
	switch ev.Kind {
	case KindLease:
		x.state, x.attempt, x.leaseID, x.owner, x.deadline, x.notBefore = StateInflight, ev.Attempt, ev.LeaseID, ev.Owner, ev.DeadlineMs, 0
		m.leaseSeq = ev.LeaseID
	case KindAck:
		delete(m.msgs, ev.Offset)
	case KindRequeue:
		released := x.released
		if ev.Reason == ReasonReleased && released < ReleasesUncountedMax {
			released++
		}
		var ended uint64
		if ev.Reason != ReasonNack {
			ended = ev.LeaseID // expired or released: a late ack or fail still applies
		}
		*x = mmsg{state: StateReady, attempt: x.attempt, released: released, notBefore: ev.NotBeforeMs, expires: x.expires, ended: ended}
	case KindDeadLetter:
		if ev.Target == "" {
			delete(m.msgs, ev.Offset)
			break
		}
		*x = mmsg{state: StateDeadLettering, attempt: x.attempt, released: x.released, expires: x.expires,
			reason: ev.Reason, target: ev.Target, dlAt: ev.AtMs}
	case KindDeadLetterDone:
		delete(m.msgs, ev.Offset)
	case KindRelocate:
		m.body[ev.Offset] = lsn
	case KindExtend:
		if x.state != StateInflight || x.leaseID != ev.LeaseID {
			return fmt.Errorf("model: extend of offset %d lease %d, which is not its current lease", ev.Offset, ev.LeaseID)
		}
		x.deadline = ev.DeadlineMs
	}
	return nil
}

func (m *model) info(off uint64, now int64) Info {
	x, ok := m.msgs[off]
	if !ok {
		return Info{Offset: off, State: StateSettled}
	}
	in := Info{Offset: off, State: x.state, Attempt: x.attempt, Released: x.released, NotBeforeMs: x.notBefore, ExpiresAtMs: x.expires}
	switch x.state {
	case StateReady:
		if x.notBefore > now {
			in.State = StateDelayed
		}
		in.EndedLeaseID = x.ended
	case StateInflight:
		in.LeaseID, in.Owner, in.DeadlineMs = x.leaseID, x.owner, x.deadline
	case StateDeadLettering:
		in.Reason, in.Target, in.DeadlineMs = x.reason, x.target, x.dlAt
	}
	return in
}

func (m *model) frontier() uint64 {
	if offs := m.sortedOffsets(); len(offs) > 0 {
		return offs[0]
	}
	return m.next
}

func (m *model) settledRanges() int {
	n := 0
	inRun := false
	for off := uint64(0); off < m.next; off++ {
		_, unsettled := m.msgs[off]
		if !unsettled && !inRun {
			n++
		}
		inRun = !unsettled
	}
	return n
}

// TestModel drives random command sequences against State and the model and
// checks, after every step, that they agree on every offset and counter, that
// the frontier only rises, that a settled offset stays settled, and that the
// state survives a crash: restoring an earlier checkpoint and replaying the
// log reproduces it exactly, and so does a replay from nothing.
func TestModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		owners := []string{"a", "b", "c"}
		// members are (cohort, member) pairs a consumer may lease as.
		members := [][2]string{{"", ""}, {"c1", "m1"}, {"c1", "m2"}, {"c1", ""}, {"c2", "m1"}}
		cfg := Config{
			MaxRetries:   rapid.SampledFrom([]int{NoRetries, 1, 2, 0}).Draw(t, "maxRetries"),
			LeaseMs:      1000,
			DefaultTTLMs: rapid.SampledFrom([]int64{0, 0, 4000}).Draw(t, "defaultTTL"),
			// Dead-letter queues run without a retry limit, and keep
			// everything.
			UnlimitedRetries: rapid.IntRange(0, 4).Draw(t, "unlimited") == 0,
			DeadLetter:       DeadLetterPolicy{Keep: rapid.IntRange(0, 4).Draw(t, "keep") == 0},
		}
		// A small slack makes index compaction happen within a run.
		slack := rapid.SampledFrom([]int{0, 1, 3, garbageSlack}).Draw(t, "slack")
		s := New(cfg)
		s.slack = slack
		s.bits.slack = slack
		h := &harness{s: s, nextLSN: rapid.Uint64Range(0, 3).Draw(t, "firstLSN")}
		m := &model{cfg: s.Config(), msgs: map[uint64]*mmsg{}, body: map[uint64]uint64{}}
		now := int64(1_000_000)
		var frontier uint64
		everSettled := map[uint64]bool{}
		type checkpoint struct {
			snap   []byte
			logLen int
		}
		checkpoints := []checkpoint{{snap: New(cfg).Snapshot(nil)}}

		// run applies a command's events to both sides after checking that
		// the queue produced exactly what the model predicts.
		run := func(t *rapid.T, got, want []Event, gotErr, wantErr error) {
			if wantErr != nil || gotErr != nil {
				if !errors.Is(gotErr, wantErr) {
					t.Fatalf("error %v, want %v", gotErr, wantErr)
				}
				if len(got) != 0 {
					t.Fatalf("events %v returned with error", got)
				}
				return
			}
			if len(got) != len(want) {
				t.Fatalf("got %d events %v, want %d %v", len(got), got, len(want), want)
			}
			for i := range got {
				if !eventsEqual(got[i], want[i]) {
					t.Fatalf("event %d:\n got %s\nwant %s", i, formatEvent(got[i]), formatEvent(want[i]))
				}
			}
			start := len(h.log)
			if _, err := h.apply(got); err != nil {
				t.Fatal(err)
			}
			for _, r := range h.log[start:] {
				ev, _ := DecodeEvent(r.kind, r.payload)
				if err := m.apply(r.lsn, ev); err != nil {
					t.Fatal(err)
				}
			}
		}
		// pick chooses an offset to settle: usually an inflight one, with
		// its lease id most of the time, otherwise anything near the log.
		pick := func(t *rapid.T) (uint64, uint64) {
			var inflight []uint64
			for _, off := range m.sortedOffsets() {
				if m.msgs[off].state == StateInflight {
					inflight = append(inflight, off)
				}
			}
			var ended []uint64
			for _, off := range m.sortedOffsets() {
				if x := m.msgs[off]; x.state == StateReady && x.ended != 0 {
					ended = append(ended, off)
				}
			}
			if len(ended) > 0 && rapid.IntRange(0, 3).Draw(t, "pickEnded") == 0 {
				off := rapid.SampledFrom(ended).Draw(t, "off")
				return off, m.msgs[off].ended
			}
			if len(inflight) > 0 && rapid.IntRange(0, 4).Draw(t, "pickInflight") > 0 {
				off := rapid.SampledFrom(inflight).Draw(t, "off")
				lease := m.msgs[off].leaseID
				if rapid.IntRange(0, 5).Draw(t, "staleLease") == 0 {
					lease = rapid.Uint64Range(0, m.leaseSeq+1).Draw(t, "lease")
				}
				return off, lease
			}
			return rapid.Uint64Range(0, m.next+1).Draw(t, "off"), rapid.Uint64Range(0, m.leaseSeq+1).Draw(t, "lease")
		}

		t.Repeat(map[string]func(*rapid.T){
			"enqueue": func(t *rapid.T) {
				msg := &Message{Body: []byte("body"), Key: []byte("k"), Headers: []Header{{"h", "v"}}}
				if d := rapid.SampledFrom([]int64{0, 0, 500, 2500}).Draw(t, "delay"); d > 0 {
					msg.NotBeforeMs = now + d
				}
				if ttl := rapid.SampledFrom([]int64{0, 0, 800, 3000}).Draw(t, "ttl"); ttl > 0 {
					msg.ExpiresAtMs = now + ttl
				}
				got, err := s.Enqueue(nil, msg, now)
				run(t, got, []Event{m.enqueue(msg, now)}, err, nil)
			},
			"lease": func(t *rapid.T) {
				owner := rapid.SampledFrom(owners).Draw(t, "owner")
				max := rapid.SampledFrom([]int{0, 1, 2, 3, 3, chunkLSNs + 5}).Draw(t, "max")
				// Mostly what the gate admits, sometimes someone else.
				who := rapid.SampledFrom(members).Draw(t, "who")
				if rapid.IntRange(0, 2).Draw(t, "admitted") > 0 {
					who = [2]string{m.gate.Cohort, m.gate.Member}
				}
				run(t, s.LeaseAs(nil, owner, who[0], who[1], max, now), m.lease(owner, who[0], who[1], max, now), nil, nil)
			},
			"assign": func(t *rapid.T) {
				to := rapid.SampledFrom(members).Draw(t, "to")
				got, err := s.Assign(nil, to[0], to[1], now)
				var want []Event
				var wantErr error
				inflight := false
				for _, x := range m.msgs {
					inflight = inflight || x.state == StateInflight
				}
				switch {
				case to[0] == m.gate.Cohort && to[1] == m.gate.Member:
				case inflight:
					wantErr = ErrGateBusy
				default:
					want = []Event{{Kind: KindAssign, Target: to[0], Owner: to[1], Epoch: m.gate.Epoch + 1, AtMs: now}}
				}
				run(t, got, want, err, wantErr)
			},

			"ack": func(t *rapid.T) {
				off, lease := pick(t)
				got, err := s.Ack(nil, off, lease)
				var want []Event
				_, wantErr := m.leased(off, lease)
				if _, ok := m.ended(off, lease); ok {
					wantErr = nil // the late ack of a lease that ended applies
				}
				if wantErr == nil {
					want = []Event{{Kind: KindAck, Offset: off, LeaseID: lease}}
				}
				run(t, got, want, err, wantErr)
			},
			"nack": func(t *rapid.T) {
				off, lease := pick(t)
				nb := now + rapid.SampledFrom([]int64{0, -5, 700}).Draw(t, "notBefore")
				got, err := s.Nack(nil, off, lease, nb, now)
				var want []Event
				x, wantErr := m.leased(off, lease)
				if _, ok := m.ended(off, lease); ok {
					wantErr = ErrAlreadyRequeued
				}
				if wantErr == nil {
					want = []Event{m.requeue(off, x, ReasonNack, nb, now)}
				}
				run(t, got, want, err, wantErr)
			},
			"extend": func(t *rapid.T) {
				off, lease := pick(t)
				deadline := now + rapid.SampledFrom([]int64{-5, 0, 1, 300, 1500, 5000}).Draw(t, "extendBy")
				got, err := s.Extend(nil, off, lease, deadline, now)
				var want []Event
				_, wantErr := m.leased(off, lease)
				if deadline <= now {
					wantErr = ErrInvalidDeadline
				}
				if wantErr == nil {
					want = []Event{{Kind: KindExtend, Offset: off, LeaseID: lease, DeadlineMs: deadline, AtMs: now}}
				}
				run(t, got, want, err, wantErr)
			},
			"release": func(t *rapid.T) {
				off, lease := pick(t)
				got, err := s.Release(nil, off, lease, now)
				var want []Event
				x, wantErr := m.leased(off, lease)
				if _, ok := m.ended(off, lease); ok {
					wantErr = ErrAlreadyRequeued
				}
				if wantErr == nil {
					want = []Event{m.requeue(off, x, ReasonReleased, 0, now)}
				}
				run(t, got, want, err, wantErr)
			},
			"fail": func(t *rapid.T) {
				off, lease := pick(t)
				got, err := s.Fail(nil, off, lease, now)
				var want []Event
				if _, ok := m.ended(off, lease); ok {
					// A late fail of the lease that ended: dead-lettered,
					// or, in a Keep queue, already back where a fail puts it.
					if m.cfg.DeadLetter.Keep {
						run(t, got, nil, err, ErrAlreadyRequeued)
					} else {
						run(t, got, []Event{m.deadLetter(off, lease, ReasonFailed, now)}, err, nil)
					}
					return
				}
				if x, wantErr := m.leased(off, lease); wantErr == nil {
					want = []Event{m.deadLetter(off, lease, ReasonFailed, now)}
					if m.cfg.DeadLetter.Keep {
						// Nothing leaves a Keep queue but by an ack.
						want = []Event{m.requeue(off, x, ReasonNack, 0, now)}
					}
				} else {
					run(t, got, nil, err, wantErr)
					return
				}
				run(t, got, want, err, nil)
			},
			"tick": func(t *rapid.T) {
				run(t, s.Tick(nil, now), m.tick(now), nil, nil)
			},
			"purge": func(t *rapid.T) {
				// Queued messages below the bound, lowest first, at most
				// max, discarded whatever the dead-letter policy.
				below := rapid.Uint64Range(0, m.next+1).Draw(t, "below")
				max := rapid.SampledFrom([]int{0, 1, 2, 4, chunkLSNs}).Draw(t, "purgeMax")
				var want []Event
				for _, off := range m.sortedOffsets() {
					if len(want) == max || off >= below {
						break
					}
					if m.msgs[off].state == StateReady {
						want = append(want, Event{Kind: KindDeadLetter, Offset: off, Reason: ReasonPurged, AtMs: now})
					}
				}
				run(t, s.Purge(nil, below, max, now), want, nil, nil)
			},
			"advance": func(t *rapid.T) {
				// Mostly round steps, so the clock lands exactly on deadlines,
				// not-befores and expiries and the <= boundaries get tested.
				if rapid.IntRange(0, 4).Draw(t, "roundStep") > 0 {
					now += rapid.SampledFrom([]int64{0, 100, 200, 500, 700, 800, 1000}).Draw(t, "advanceMs")
				} else {
					now += rapid.Int64Range(0, 2500).Draw(t, "advanceMs")
				}
			},
			"deadLettered": func(t *rapid.T) {
				var pending []uint64
				for _, off := range m.sortedOffsets() {
					if m.msgs[off].state == StateDeadLettering {
						pending = append(pending, off)
					}
				}
				var off uint64
				if len(pending) > 0 && rapid.Bool().Draw(t, "pickPending") {
					off = rapid.SampledFrom(pending).Draw(t, "off")
				} else {
					off = rapid.Uint64Range(0, m.next+1).Draw(t, "off")
				}
				got, err := s.DeadLettered(nil, off, now)
				var want []Event
				var wantErr error
				switch x, ok := m.msgs[off]; {
				case off >= m.next:
					wantErr = ErrUnknownOffset
				case !ok:
					wantErr = ErrAlreadySettled
				case x.state != StateDeadLettering:
					wantErr = ErrNotDeadLettering
				default:
					want = []Event{{Kind: KindDeadLetterDone, Offset: off, AtMs: now}}
				}
				run(t, got, want, err, wantErr)
			},
			"relocate": func(t *rapid.T) {
				offs := m.sortedOffsets()
				var off uint64
				if len(offs) > 0 && rapid.IntRange(0, 4).Draw(t, "pickLive") > 0 {
					off = rapid.SampledFrom(offs).Draw(t, "off")
				} else {
					off = rapid.Uint64Range(0, m.next+1).Draw(t, "off")
				}
				got, err := s.Relocate(nil, off)
				var want []Event
				var wantErr error
				_, live := m.msgs[off]
				switch {
				case off >= m.next:
					wantErr = ErrUnknownOffset
				case !live:
					wantErr = ErrAlreadySettled
				default:
					want = []Event{{Kind: KindRelocate, Offset: off}}
				}
				// The partition attaches the body it read; any will do here.
				body := &Message{PublishedAtMs: 1, Body: []byte("body")}
				for i := range got {
					got[i].Msg = body
				}
				for i := range want {
					want[i].Msg = body
				}
				run(t, got, want, err, wantErr)
			},
			"setTarget": func(t *rapid.T) {
				c := s.Config()
				c.DeadLetter.Target = rapid.SampledFrom([]string{"", "dlq"}).Draw(t, "target")
				c.DeadLetter.Keep = rapid.IntRange(0, 5).Draw(t, "keepNow") == 0
				s.SetConfig(c)
				m.cfg = s.Config()
			},
			"gap": func(t *rapid.T) {
				// Records of other types take LSNs the queue never sees;
				// sometimes enough to start a new bitmap chunk or skip some.
				h.nextLSN += rapid.SampledFrom([]uint64{1, 2, 3, 1, chunkLSNs - 1, chunkLSNs, 3 * chunkLSNs}).Draw(t, "gap")
			},
			"noop": func(t *rapid.T) {
				// A raft leader's no-op: an LSN applied as a settled gap.
				lsn, err := h.gap()
				if err != nil {
					t.Fatal(err)
				}
				m.next = lsn + 1
			},
			"enqueueMany": func(t *rapid.T) {
				// A backlog of plain messages, sometimes interleaved with
				// no-ops, crossing bitmap chunk boundaries.
				n := rapid.IntRange(1, chunkLSNs+10).Draw(t, "many")
				every := rapid.SampledFrom([]int{0, 0, 1, 7}).Draw(t, "noopEvery")
				for i := 0; i < n; i++ {
					if every > 0 && i%every == 0 {
						lsn, err := h.gap()
						if err != nil {
							t.Fatal(err)
						}
						m.next = lsn + 1
					}
					msg := &Message{Body: []byte("b")}
					got, err := s.Enqueue(nil, msg, now)
					run(t, got, []Event{m.enqueue(msg, now)}, err, nil)
				}
			},
			"checkpoint": func(t *rapid.T) {
				checkpoints = append(checkpoints, checkpoint{snap: s.Snapshot(nil), logLen: len(h.log)})
			},
			"crash": func(t *rapid.T) {
				// Restart from a random earlier checkpoint plus the whole log
				// (the part the checkpoint covers must be skipped) and carry
				// on with the rebuilt state.
				cp := rapid.SampledFrom(checkpoints).Draw(t, "checkpoint")
				r, err := Restore(cfg, cp.snap)
				if err != nil {
					t.Fatal(err)
				}
				r.SetConfig(s.Config())
				r.slack = slack
				r.bits.slack = slack
				if err := replay(r, h.log); err != nil {
					t.Fatal(err)
				}
				if got, want := dump(r, now), dump(s, now); got != want {
					t.Fatalf("restored state differs:\n%s\nwant:\n%s", got, want)
				}
				if got, want := r.BodyFloor(), s.BodyFloor(); got != want {
					t.Fatalf("restored body floor %d, want %d", got, want)
				}
				s = r
				h.s = r
			},
			"": func(t *rapid.T) {
				if err := s.verify(); err != nil {
					t.Fatal(err)
				}
				if s.NextLSN() != m.next {
					t.Fatalf("next lsn %d, model %d", s.NextLSN(), m.next)
				}
				f := s.Frontier()
				if f != m.frontier() || f < frontier {
					t.Fatalf("frontier %d, model %d, previous %d", f, m.frontier(), frontier)
				}
				frontier = f
				var want Stats
				want.NextLSN, want.Frontier, want.SettledRanges = m.next, m.frontier(), m.settledRanges()
				for off := uint64(0); off < m.next+2; off++ {
					got, ok := s.Lookup(off, now)
					if ok != (off < m.next) {
						t.Fatalf("lookup %d: found=%v with next lsn %d", off, ok, m.next)
					}
					if !ok {
						continue
					}
					w := m.info(off, now)
					if got != w {
						t.Fatalf("lookup %d:\n got %s\nwant %s", off, formatInfo(got), formatInfo(w))
					}
					switch w.State {
					case StateReady:
						want.Ready++
					case StateDelayed:
						want.Delayed++
					case StateInflight:
						want.Inflight++
					case StateDeadLettering:
						want.DeadLettering++
					case StateSettled:
						everSettled[off] = true
					}
					if everSettled[off] && w.State != StateSettled {
						t.Fatalf("offset %d came back from settled", off)
					}
					// Only failed deliveries are bounded by the retry limit;
					// released ones come on top of it.
					if !m.cfg.UnlimitedRetries && w.Attempt-w.Released > uint32(max(m.cfg.MaxRetries, 0)+1) {
						t.Fatalf("offset %d attempt %d (%d released) beyond max retries %d", off, w.Attempt, w.Released, m.cfg.MaxRetries)
					}
					if w.Released > w.Attempt {
						t.Fatalf("offset %d released %d times in %d attempts", off, w.Released, w.Attempt)
					}
				}
				if got := s.Stats(now); got != want {
					t.Fatalf("stats %+v, want %+v", got, want)
				}
				for _, o := range owners {
					var w []Info
					for _, off := range m.sortedOffsets() {
						if x := m.msgs[off]; x.state == StateInflight && x.owner == o {
							w = append(w, m.info(off, now))
						}
					}
					if got := s.Inflight(o); !slices.Equal(got, w) {
						t.Fatalf("inflight(%s) = %v, want %v", o, got, w)
					}
				}
				var wdl []Info
				for _, off := range m.sortedOffsets() {
					if m.msgs[off].state == StateDeadLettering {
						wdl = append(wdl, m.info(off, now))
					}
				}
				if got := s.PendingDeadLetters(); !slices.Equal(got, wdl) && (len(got) != 0 || len(wdl) != 0) {
					t.Fatalf("pending dead letters %v, want %v", got, wdl)
				}
				// Next deadline: earliest lease deadline, future not-before,
				// or TTL of a queued message.
				var wantAt int64
				wantOK := false
				consider := func(at int64) {
					if !wantOK || at < wantAt {
						wantAt, wantOK = at, true
					}
				}
				for _, x := range m.msgs {
					switch x.state {
					case StateInflight:
						consider(x.deadline)
					case StateReady:
						if x.notBefore > now {
							consider(x.notBefore)
						}
						if x.expires > 0 && !m.cfg.DeadLetter.Keep {
							consider(x.expires)
						}
					}
				}
				if at, ok := s.NextDeadlineMs(); ok != wantOK || at != wantAt {
					t.Fatalf("next deadline %d,%v want %d,%v", at, ok, wantAt, wantOK)
				}
				// Body locations: every offset, the floor, and the oldest
				// bodies below a random bound.
				for off := uint64(0); off < m.next+2; off++ {
					if got, want := s.BodyLSN(off), m.bodyLSN(off); got != want {
						t.Fatalf("body of offset %d at %d, model %d", off, got, want)
					}
				}
				bodies := m.bodies()
				wantFloor := m.next
				if len(bodies) > 0 {
					wantFloor = bodies[0].LSN
				}
				if got := s.BodyFloor(); got != wantFloor || got < f {
					t.Fatalf("body floor %d, model %d, frontier %d", got, wantFloor, f)
				}
				below := rapid.Uint64Range(0, m.next+1).Draw(t, "below")
				maxN := rapid.IntRange(0, 5).Draw(t, "maxBodies")
				var wantOld []BodyLoc
				for _, b := range bodies {
					if b.LSN < below && len(wantOld) < maxN {
						wantOld = append(wantOld, b)
					}
				}
				if got := s.OldestBodies(nil, below, maxN); !slices.Equal(got, wantOld) {
					t.Fatalf("oldest bodies below %d (max %d) = %v, want %v", below, maxN, got, wantOld)
				}
			},
		})

		// Final crash checks: every checkpoint + log, a replay from nothing,
		// and a snapshot of the final state all reproduce it.
		// The config in force decides what the dump shows (a Keep queue
		// reports no TTL deadline), so restore under it.
		want := dump(s, now)
		for i, cp := range checkpoints {
			r, err := Restore(s.Config(), cp.snap)
			if err != nil {
				t.Fatal(err)
			}
			if err := replay(r, h.log[cp.logLen:]); err != nil {
				t.Fatal(err)
			}
			if got := dump(r, now); got != want {
				t.Fatalf("checkpoint %d + tail replay:\n%s\nwant:\n%s", i, got, want)
			}
		}
		r, err := Restore(s.Config(), s.Snapshot(nil))
		if err != nil {
			t.Fatal(err)
		}
		if got := dump(r, now); got != want {
			t.Fatalf("snapshot round trip:\n%s\nwant:\n%s", got, want)
		}
	})
}
