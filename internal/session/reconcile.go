package session

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// Reconcile compares the subscriptions a client holds after a reconnect with the
// ones the session holds, acts on the difference and sends RECONCILE_RESULT
// (request reqID) through sink before any delivery of a recreated subscription.
//
// Matching is by subscription id, then by topic, group, partition and ack mode
// (prefetch may differ: the server's clamped value is the one in force).
//
//	client has | server has      | conservative       | restore
//	-----------+-----------------+--------------------+------------------------------
//	id, same   | id              | keep               | keep
//	id         | id, different   | close both:        | close server's, recreate with
//	           |                 | close_client_side  | the client's view (new id)
//	id         | -               | close_client_side  | recreate_client_side (new id)
//	-          | id              | close_server_side  | close_server_side
//
// A subscription the client lists that the broker ended since the last
// reconciliation (its queue was deleted, or it failed) is never recreated:
// its SUB_CLOSED is sent again, before the result, since the first one may
// have gone to a socket that was already dead, and its entry is
// close_client_side.
//
// Server-side closes hand the subscription's leases back to ready. A recreate that
// fails is reported as close_client_side with the error in Reason. After the
// result, the deliveries noted at the last resume are re-sent (see Resend),
// unless req.InflightFollows: then Inflight re-sends only those the client
// lacks.
func (s *Session) Reconcile(sink Sink, reqID uint64, req *protocol.Reconcile) error {
	return s.ReconcileWith(sink, reqID, req, nil, nil)
}

// ReconcileWith is Reconcile with checks on every subscription it would
// recreate: allow(topic) returning an error leaves that subscription closed,
// with the error as its entry's reason, as for any recreate that fails, and
// mayCreate decides whether a recreate may create its queue, as for
// SubscribeChecked. The server passes the connection's consume and manage
// permissions, so the restore policy cannot open what SUBSCRIBE would
// refuse. A nil allow or mayCreate permits everything.
func (s *Session) ReconcileWith(sink Sink, reqID uint64, req *protocol.Reconcile, allow func(topic string) error, mayCreate MayCreate) error {
	if req.Policy != protocol.ReconcileConservative && req.Policy != protocol.ReconcileRestore {
		return protocol.Errorf(protocol.CodeBadRequest, "reconcile policy %d", req.Policy)
	}
	restore := req.Policy == protocol.ReconcileRestore
	cohorts := cohortsOf(req)
	seen := make(map[uint64]bool, len(req.Subs))
	for _, c := range req.Subs {
		if seen[c.SubID] {
			return protocol.Errorf(protocol.CodeBadRequest, "subscription %d listed twice", c.SubID)
		}
		seen[c.SubID] = true
	}

	s.mu.Lock()
	if s.state == stateClosed {
		s.mu.Unlock()
		return ErrClosed
	}
	server := make(map[uint64]*subState, len(s.subs))
	for id, st := range s.subs {
		server[id] = st
	}
	brokerClosed := make(map[uint64]*protocol.SubClosed, len(s.brokerClosed))
	for _, c := range s.brokerClosed {
		brokerClosed[c.SubID] = c
	}
	s.brokerClosed = nil
	s.mu.Unlock()

	var (
		entries      []protocol.ReconcileEntry
		toClose      []*subState
		recreate     []int // indexes into entries
		resendClosed []*protocol.SubClosed
	)
	for _, c := range req.Subs {
		e := protocol.ReconcileEntry{ClientSubID: c.SubID, Client: c}
		st := server[c.SubID]
		if st != nil {
			e.Server = st.view
			if sameSub(c, st.view) && cohorts[c.SubID].Cohort == st.cohort && cohorts[c.SubID].Member == st.member {
				e.Action, e.ServerSubID, e.Reason = protocol.ActionKeep, st.id, "matches"
				entries = append(entries, e)
				continue
			}
			toClose = append(toClose, st)
			e.Reason = "differs from the server's subscription"
		} else if bc := brokerClosed[c.SubID]; bc != nil {
			// The broker ended it, and its SUB_CLOSED may have died with the
			// old socket: told again below, never recreated (a recreate
			// would bring a deleted queue back).
			e.Action, e.Reason = protocol.ActionCloseClientSide, "closed by the broker: "+bc.Message
			resendClosed = append(resendClosed, bc)
			entries = append(entries, e)
			continue
		} else {
			e.Reason = "not held by the server"
		}
		e.Action = protocol.ActionCloseClientSide
		if restore {
			recreate = append(recreate, len(entries))
		}
		entries = append(entries, e)
	}
	for _, id := range slices.Sorted(maps.Keys(server)) {
		if st := server[id]; !seen[id] {
			toClose = append(toClose, st)
			entries = append(entries, protocol.ReconcileEntry{
				Action: protocol.ActionCloseServerSide, ServerSubID: id, Server: st.view, Reason: "not held by the client",
			})
		}
	}

	// Close first, so that recreated subscriptions fit under the session's limit.
	s.mu.Lock()
	var closing []*subState
	for _, st := range toClose {
		if !st.closed {
			st.closed, st.reconciled = true, true
			s.forgetSubLocked(st)
			closing = append(closing, st)
		}
	}
	s.mu.Unlock()
	for _, st := range closing {
		st.sub.Close()
	}
	var created []*subState
	for _, i := range recreate {
		e := &entries[i]
		c := e.Client
		if allow != nil {
			if err := allow(c.Topic); err != nil {
				e.Reason = "recreate failed: " + err.Error()
				continue
			}
		}
		co := cohorts[c.SubID]
		nst, err := s.openSub(protocol.Subscribe{Topic: c.Topic, Group: c.Group, Partition: c.Partition, AckMode: c.AckMode, Prefetch: c.Prefetch,
			Cohort: co.Cohort, Member: co.Member}, mayCreate)
		if err != nil {
			e.Reason = "recreate failed: " + err.Error()
			continue
		}
		created = append(created, nst)
		e.Action, e.ServerSubID, e.Server, e.Reason = protocol.ActionRecreateClient, nst.id, nst.view, "recreated"
	}

	var byAction [protocol.ActionRecreateClient + 1]int
	for _, e := range entries {
		if int(e.Action) < len(byAction) {
			byAction[e.Action]++
		}
	}
	s.reg.recKeep.Add(uint64(byAction[protocol.ActionKeep]))
	s.reg.recCloseClient.Add(uint64(byAction[protocol.ActionCloseClientSide]))
	s.reg.recCloseServer.Add(uint64(byAction[protocol.ActionCloseServerSide]))
	s.reg.recNew.Add(uint64(byAction[protocol.ActionRecreateClient]))

	s.mu.Lock()
	if s.sink == sink && sink != nil {
		for _, bc := range resendClosed {
			sink.Send(Outbound{Body: bc})
		}
		sink.Send(Outbound{RequestID: reqID, Body: &protocol.ReconcileResult{Entries: entries}})
	}
	var wake []Subscription
	for _, st := range created {
		if sub := s.announceLocked(st); sub != nil {
			wake = append(wake, sub)
		}
	}
	// Deliveries of kept subscriptions that the previous socket may have lost
	// follow the decision; those of closed subscriptions were handed back.
	if !req.InflightFollows {
		s.resendLocked()
	}
	s.mu.Unlock()
	wakeSubs(wake...)
	s.logger().Info("reconciled", "policy", req.Policy, "client_subs", len(req.Subs),
		"keep", byAction[protocol.ActionKeep], "close_client_side", byAction[protocol.ActionCloseClientSide],
		"close_server_side", byAction[protocol.ActionCloseServerSide], "recreate_client_side", byAction[protocol.ActionRecreateClient])
	return nil
}

func sameSub(a, b protocol.SubView) bool {
	return a.Topic == b.Topic && a.Group == b.Group && a.Partition == b.Partition && a.AckMode == b.AckMode
}

// Inflight answers INFLIGHT (request reqID) through sink: of the deliveries
// noted for re-send at the last resume, it re-sends those the client did not
// report, then sends INFLIGHT_RESULT listing the reported tags the session
// no longer holds (stale) and counting the re-sent and the kept ones. A
// reported tag is kept when the session holds it under the same lease (a
// zero lease id in the report matches any). If the re-sends were made
// already (the client sent another request first), none is made again.
func (s *Session) Inflight(sink Sink, reqID uint64, req *protocol.Inflight) error {
	s.mu.Lock()
	if s.state == stateClosed {
		s.mu.Unlock()
		return ErrClosed
	}
	reported := make(map[uint64]bool, len(req.Entries))
	var stale []uint64
	var checks []leaseCheck
	kept := 0
	for i := range req.Entries {
		x := &req.Entries[i]
		if reported[x.Tag] {
			continue // listed twice: judged once
		}
		ref := &x.Lease
		if ref.LeaseID == 0 {
			ref = nil
		}
		if e, ok := s.tags[x.Tag]; ok && !e.st.closed && !e.st.autoAck && e.matches(ref) {
			kept++
			reported[x.Tag] = true
			continue
		}
		if _, taken := s.tags[x.Tag]; !taken && x.Tag != 0 {
			if t, e, ok := s.adoptedForLocked(ref); ok && !e.st.closed && !e.st.autoAck {
				// A lease taken back after a restart: the client's tag
				// names it from now on, and it is not sent again.
				delete(s.tags, t)
				e.adopted = false
				s.tags[x.Tag] = e
				kept++
				reported[x.Tag] = true
				continue
			}
		}
		if s.fromRestart && ref != nil {
			// Judged by its lease: asked of its partition below, and
			// otherwise when the client settles it (restore.go).
			if lc, ok := s.reg.subFor(ref.SubID, s).(LeaseChecker); ok {
				checks = append(checks, leaseCheck{tag: x.Tag, ref: *ref, lc: lc})
			}
			continue
		}
		stale = append(stale, x.Tag)
	}
	if len(checks) > 0 {
		// A delivery the client held across the restart whose lease has
		// ended for good (settled, or the message leased again) is stale:
		// the client drops it instead of handing it to the application.
		s.mu.Unlock()
		stale = append(stale, staleLeases(checks)...)
		s.mu.Lock()
		if s.state == stateClosed {
			s.mu.Unlock()
			return ErrClosed
		}
	}
	s.fromRestart = false
	resent := 0
	for _, tag := range s.resendTags {
		e, ok := s.tags[tag]
		if !ok || e.st.closed || reported[tag] {
			continue
		}
		if !s.servesLocked(e) {
			s.dropTagLocked(tag, e) // the partition's owner judges it now
			continue
		}
		s.emitLocked(Outbound{Body: e.d, NotAfterMs: e.notAfterMs})
		resent++
	}
	s.resendTags = nil
	if s.sink == sink && sink != nil {
		sink.Send(Outbound{RequestID: reqID, Body: &protocol.InflightResult{Stale: stale, Resent: uint64(resent), Kept: uint64(kept)}})
	}
	s.mu.Unlock()
	s.reg.resent.Add(uint64(resent))
	s.reg.inflightResent.Add(uint64(resent))
	s.reg.inflightStale.Add(uint64(len(stale)))
	s.reg.inflightKept.Add(uint64(kept))
	s.logger().Info("inflight reconciled", "reported", len(req.Entries), "resent", resent, "stale", len(stale), "kept", kept)
	return nil
}

// leaseCheck is a delivery a client reported after a restart, to be judged
// by its lease.
type leaseCheck struct {
	tag uint64
	ref protocol.LeaseRef
	lc  LeaseChecker
}

// leaseCheckTimeout bounds the partition lookups of one INFLIGHT; a lease
// not judged by then is judged when the client settles it.
const leaseCheckTimeout = 2 * time.Second

// staleLeases returns the tags of checks whose leases their partitions say
// no settle can take effect by any more. A lookup that fails (partition
// unavailable, time out) leaves its tag out.
func staleLeases(checks []leaseCheck) []uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), leaseCheckTimeout)
	defer cancel()
	var stale []uint64
	for _, c := range checks {
		cur, err := c.lc.LeaseCurrent(ctx, c.ref.Partition, c.ref.Offset, c.ref.LeaseID)
		if err == nil && !cur {
			stale = append(stale, c.tag)
		}
	}
	return stale
}
