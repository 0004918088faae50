package session

import (
	"sync/atomic"

	"github.com/sinewmq/sinew/protocol"
)

// Settle semantics. A settle names a lease by its delivery tag and, when the
// client sends one, by its lease reference. Per tag:
//
//	the tag / lease reference names           outcome
//	-----------------------------------------  ------------------------------------------
//	a lease this session holds                 sent to the broker: ok, or its refusal
//	a lease this session settled the same way  ok again (outcomes table), not re-applied
//	a lease this session settled another way   stale_lease
//	a lease that ended while this session      sent to the broker, which applies an ACK or
//	held it (expiry, release) (ended table)    FAIL while the message is not leased again,
//	                                           answers a NACK ok, and stale_lease otherwise
//	only a lease reference, to a subscription  sent to the broker as above
//	of this session or one that is closed
//	only a lease reference, to a live          stale_lease: never someone else's lease
//	subscription of another session
//	a lease of a subscription reconciliation   stale_lease: the client was told the
//	closed                                     subscription is gone
//	nothing known, tag issued here             stale_lease
//	nothing known, tag never issued here       unknown_tag
//
// The outcomes and ended tables are bounded (Config.SettleMemoryMax each),
// dropping their oldest entries first: a settle older than that is judged by
// its lease reference alone.

// leaseRec is a lease the session remembers after it stopped holding it.
type leaseRec struct {
	sub       Subscription
	subID     uint64
	partition uint32
	offset    uint64
	leaseID   uint64
	epoch     uint64      // the DELIVER's epoch (0 on a single node)
	op        protocol.Op // outcomes only: the settle that ended it
}

// matches reports whether ref names this lease. A reference of epoch 0
// (a client that does not echo epochs) matches any epoch, as does a lease
// whose epoch is not known (restored after a restart); another epoch names
// a delivery of another owner.
func (r *leaseRec) matches(ref *protocol.LeaseRef) bool {
	return ref == nil || ref.SubID == r.subID && ref.Partition == r.partition && ref.Offset == r.offset && ref.LeaseID == r.leaseID &&
		(ref.Epoch == 0 || r.epoch == 0 || ref.Epoch == r.epoch)
}

func (e *tagEntry) matches(ref *protocol.LeaseRef) bool {
	return ref == nil || ref.SubID == e.st.id && ref.Partition == e.partition && ref.Offset == e.offset && ref.LeaseID == e.leaseID &&
		(ref.Epoch == 0 || e.epoch == 0 || ref.Epoch == e.epoch)
}

func (e *tagEntry) rec(op protocol.Op) leaseRec {
	return leaseRec{sub: e.st.sub, subID: e.st.id, partition: e.partition, offset: e.offset, leaseID: e.leaseID, epoch: e.epoch, op: op}
}

// tagMemory is a map of tags bounded in entries; past the bound the oldest
// insert goes first. order may hold tags deleted since; it is compacted
// when it grows past twice the bound.
type tagMemory struct {
	m     map[uint64]leaseRec
	order []uint64
	max   int
}

func (t *tagMemory) get(tag uint64) (leaseRec, bool) {
	r, ok := t.m[tag]
	return r, ok
}

func (t *tagMemory) put(tag uint64, r leaseRec) {
	if t.max <= 0 {
		return
	}
	if t.m == nil {
		t.m = make(map[uint64]leaseRec)
	}
	if _, ok := t.m[tag]; !ok {
		for len(t.m) >= t.max && len(t.order) > 0 {
			delete(t.m, t.order[0])
			t.order = t.order[1:]
		}
		t.order = append(t.order, tag)
	}
	t.m[tag] = r
	if len(t.order) > 2*t.max {
		live := t.order[:0:0]
		for _, x := range t.order {
			if _, ok := t.m[x]; ok {
				live = append(live, x)
			}
		}
		t.order = live
	}
}

func (t *tagMemory) del(tag uint64) { delete(t.m, tag) }

func (t *tagMemory) len() int { return len(t.m) }

// settleJob is one tag's settle on its way to the broker.
type settleJob struct {
	i     int
	tag   uint64
	rec   leaseRec
	held  bool // the session held the lease when the settle came in
	ended bool // found in the ended table
	late  bool // delivered before the latest resume, ended, or named by reference only
}

// Settle settles each tag the same way (protocol.OpAck, OpNack or OpFail) and
// calls done once with one code per tag, in order (see the table above).
// leases is empty or parallel to tags; any other length is bad_request for
// every tag. done runs on some goroutine and must not block.
func (s *Session) Settle(kind protocol.Op, tags []uint64, leases []protocol.LeaseRef, delayMs int64, done func([]protocol.Code)) {
	codes := make([]protocol.Code, len(tags))
	if len(leases) != 0 && len(leases) != len(tags) {
		for i := range codes {
			codes[i] = protocol.CodeBadRequest
		}
		done(codes)
		return
	}
	jobs := make([]settleJob, 0, len(tags))
	var repeated, lateStale, lateUnknown int
	s.mu.Lock()
	for i, t := range tags {
		var ref *protocol.LeaseRef
		if len(leases) > 0 {
			ref = &leases[i]
		}
		if ref != nil && ref.Epoch != 0 && !s.reg.cfg.Epochs {
			// A single node never issues an epoch: the reference names
			// no delivery of this broker.
			codes[i] = protocol.CodeStaleLease
			lateStale++
			continue
		}
		if e, ok := s.tags[t]; ok && e.st.sub != nil && e.matches(ref) {
			jobs = append(jobs, settleJob{i: i, tag: t, rec: e.rec(kind), held: true, late: e.gen < s.attachGen})
			continue
		}
		if r, ok := s.outcomes.get(t); ok && r.matches(ref) {
			if r.op == kind {
				codes[i] = protocol.CodeOK
				repeated++
			} else {
				codes[i] = protocol.CodeStaleLease
				lateStale++
			}
			continue
		}
		if r, ok := s.ended.get(t); ok && r.matches(ref) {
			r.op = kind
			jobs = append(jobs, settleJob{i: i, tag: t, rec: r, ended: true, late: true})
			continue
		}
		if ref != nil {
			if sub := s.reg.subFor(ref.SubID, s); sub != nil {
				jobs = append(jobs, settleJob{i: i, tag: t, late: true, rec: leaseRec{
					sub: sub, subID: ref.SubID, partition: ref.Partition, offset: ref.Offset, leaseID: ref.LeaseID, op: kind}})
			} else {
				codes[i] = protocol.CodeStaleLease
				lateStale++
			}
			continue
		}
		if t == 0 || t > s.lastTag {
			codes[i] = protocol.CodeUnknownTag
			lateUnknown++
		} else {
			// Issued here, no longer held and no longer remembered.
			codes[i] = protocol.CodeStaleLease
			lateStale++
		}
	}
	s.mu.Unlock()
	s.reg.settleRepeated.Add(uint64(repeated))
	s.reg.lateStale.Add(uint64(lateStale))
	s.reg.lateUnknown.Add(uint64(lateUnknown))
	if lateStale+lateUnknown > 0 {
		s.logger().Info("late settle rejected", "op", kind.String(), "stale_lease", lateStale, "unknown_tag", lateUnknown)
	}
	if len(jobs) == 0 {
		done(codes)
		return
	}
	var left atomic.Int64
	left.Store(int64(len(jobs)))
	var lateOK, lateBad [3]atomic.Int64 // accepted; stale, unknown, other
	for _, j := range jobs {
		j.rec.sub.Settle(kind, j.rec.partition, j.rec.offset, j.rec.leaseID, delayMs, func(c protocol.Code) {
			c = s.settled(j, kind, c)
			codes[j.i] = c
			if j.late {
				switch c {
				case protocol.CodeOK:
					lateOK[0].Add(1)
				case protocol.CodeStaleLease:
					lateBad[0].Add(1)
				case protocol.CodeUnknownTag:
					lateBad[1].Add(1)
				default:
					lateBad[2].Add(1)
				}
			}
			if left.Add(-1) == 0 {
				s.noteLate(kind, lateOK[0].Load(), lateBad[0].Load(), lateBad[1].Load(), lateBad[2].Load())
				done(codes)
			}
		})
	}
}

// noteLate counts and logs the late settles of one request.
func (s *Session) noteLate(kind protocol.Op, ok, stale, unknown, other int64) {
	s.reg.lateOK.Add(uint64(ok))
	s.reg.lateStale.Add(uint64(stale))
	s.reg.lateUnknown.Add(uint64(unknown))
	s.reg.lateOther.Add(uint64(other))
	if ok > 0 {
		s.logger().Info("late settle accepted", "op", kind.String(), "count", ok)
	}
	if stale+unknown+other > 0 {
		s.logger().Info("late settle rejected", "op", kind.String(), "stale_lease", stale, "unknown_tag", unknown, "other", other)
	}
}

// settled records the broker's answer c to job j and returns the code to
// report: a lease that is done with (ok, or stale) leaves the session's
// tables, an ok is remembered in the outcomes table, and a stale answer to
// a settle the session already made the same way (two copies of one settle
// in flight at once) is that settle's ok.
func (s *Session) settled(j settleJob, kind protocol.Op, c protocol.Code) protocol.Code {
	if c != protocol.CodeOK && c != protocol.CodeStaleLease {
		return c // refused (bad_request) or failed (unavailable ...): the lease is as it was
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.tags[j.tag]; ok && e.leaseID == j.rec.leaseID && e.st.id == j.rec.subID {
		s.dropTagLocked(j.tag, e)
	}
	if r, ok := s.ended.get(j.tag); ok && r.leaseID == j.rec.leaseID && r.subID == j.rec.subID {
		s.ended.del(j.tag)
	}
	if !j.held && !j.ended {
		// Settled by lease reference (a lease adopted after a restart and
		// never bound to the client's tag, or one a client in a cluster
		// settled through another node and then here): drop its entry,
		// or the next resume would send it again.
		for t, e := range s.tags {
			if e.leaseID == j.rec.leaseID && e.offset == j.rec.offset && e.partition == j.rec.partition && e.st.id == j.rec.subID {
				s.dropTagLocked(t, e)
				break
			}
		}
	}
	if c == protocol.CodeStaleLease {
		if r, ok := s.outcomes.get(j.tag); ok && r.op == kind && r.leaseID == j.rec.leaseID && r.subID == j.rec.subID {
			return protocol.CodeOK
		}
		return c
	}
	if s.state != stateClosed && (j.held || j.ended) {
		r := j.rec
		r.op = kind
		s.outcomes.put(j.tag, r)
	}
	return c
}

// endLeaseLocked moves the tag of a lease that ended without a settle from
// the held tags to the ended table, so a late settle of it still reaches
// the broker.
func (s *Session) endLeaseLocked(tag uint64, e tagEntry) {
	s.dropTagLocked(tag, e)
	if e.st.sub != nil && !e.st.autoAck {
		s.ended.put(tag, e.rec(0))
	}
}

// Extend renews the leases named by tags (and leases, empty or parallel to
// tags; any other length is bad_request for every tag) to the owner's now
// plus extendMs, and calls done once with one code per tag, in order. It
// looks a tag up as Settle does, with these differences: a lease this
// session settled, or one that ended without a settle, is stale_lease at
// once (an extension cannot bring a message back), and nothing leaves the
// session's tables: an extended lease is still held. On ok the deadline the
// session keeps for re-sending the delivery (a replicated partition's)
// moves to the new one. The caller bounds extendMs (queue.lease_ms_max).
// done runs on some goroutine and must not block.
func (s *Session) Extend(tags []uint64, leases []protocol.LeaseRef, extendMs int64, done func([]protocol.Code)) {
	codes := make([]protocol.Code, len(tags))
	if len(leases) != 0 && len(leases) != len(tags) || extendMs < 1 {
		for i := range codes {
			codes[i] = protocol.CodeBadRequest
		}
		done(codes)
		return
	}
	jobs := make([]settleJob, 0, len(tags))
	s.mu.Lock()
	for i, t := range tags {
		var ref *protocol.LeaseRef
		if len(leases) > 0 {
			ref = &leases[i]
		}
		if ref != nil && ref.Epoch != 0 && !s.reg.cfg.Epochs {
			codes[i] = protocol.CodeStaleLease // no delivery of a single node
			continue
		}
		if e, ok := s.tags[t]; ok && e.st.sub != nil && e.matches(ref) {
			jobs = append(jobs, settleJob{i: i, tag: t, rec: e.rec(protocol.OpExtend), held: true})
			continue
		}
		if r, ok := s.outcomes.get(t); ok && r.matches(ref) {
			codes[i] = protocol.CodeStaleLease // settled by this session
			continue
		}
		if r, ok := s.ended.get(t); ok && r.matches(ref) {
			codes[i] = protocol.CodeStaleLease // ended without a settle: back in the queue
			continue
		}
		if ref != nil {
			if sub := s.reg.subFor(ref.SubID, s); sub != nil {
				jobs = append(jobs, settleJob{i: i, tag: t, late: true, rec: leaseRec{
					sub: sub, subID: ref.SubID, partition: ref.Partition, offset: ref.Offset, leaseID: ref.LeaseID, op: protocol.OpExtend}})
			} else {
				codes[i] = protocol.CodeStaleLease
			}
			continue
		}
		if t == 0 || t > s.lastTag {
			codes[i] = protocol.CodeUnknownTag
		} else {
			codes[i] = protocol.CodeStaleLease
		}
	}
	s.mu.Unlock()
	if len(jobs) == 0 {
		done(codes)
		return
	}
	var left atomic.Int64
	left.Store(int64(len(jobs)))
	for _, j := range jobs {
		j.rec.sub.Settle(protocol.OpExtend, j.rec.partition, j.rec.offset, j.rec.leaseID, extendMs, func(c protocol.Code) {
			if c == protocol.CodeOK {
				s.extended(j, extendMs)
			}
			codes[j.i] = c
			if left.Add(-1) == 0 {
				done(codes)
			}
		})
	}
}

// extended moves the re-send deadline of the delivery j extended, when the
// session keeps one (a replicated partition's delivery), to now+extendMs
// on the session's clock: a re-send after a resume then carries what is
// left of the extended lease, not of the first one.
func (s *Session) extended(j settleJob, extendMs int64) {
	due := s.reg.cfg.Now().UnixMilli() + extendMs
	same := func(e tagEntry) bool {
		return e.leaseID == j.rec.leaseID && e.offset == j.rec.offset && e.partition == j.rec.partition && e.st.id == j.rec.subID
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if j.held {
		if e, ok := s.tags[j.tag]; ok && same(e) && e.notAfterMs != 0 {
			e.notAfterMs = due
			s.tags[j.tag] = e
		}
		return
	}
	// Named by reference only (a lease adopted after a restart, or one a
	// client reached through another node): find its tag, if any.
	for t, e := range s.tags {
		if same(e) {
			if e.notAfterMs != 0 {
				e.notAfterMs = due
				s.tags[t] = e
			}
			return
		}
	}
}
