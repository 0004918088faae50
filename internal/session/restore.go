package session

import (
	"crypto/sha256"
	"crypto/subtle"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// Restart restore. With Config.Store and a StableBackend, NewRegistry
// brings back the sessions the store held when the previous process
// stopped (cleanly or not):
//
//	1. fresh subscription ids start above every id ever recorded;
//	2. each stored session comes back dormant, with its client id, the hash
//	   of its token and its subscriptions under their old ids and owners;
//	3. each subscription adopts, on every partition, the leases recovered
//	   under its owner that are still inside their deadline. Their
//	   DELIVERs are not sent yet: they are noted for re-send, as after any
//	   resume, under fresh tags above Boot<<40 (so they never collide with
//	   tags the client holds from the previous process);
//	4. for Config.RestartGraceMs a HELLO that offers the identity (checked
//	   against the token's hash) resumes it with outcome resumed. RECONCILE
//	   keeps the subscriptions (same ids, same views). INFLIGHT binds each
//	   tag the client reports to the adopted lease it names (by lease
//	   reference), so the client's tags stay valid and nothing reaches the
//	   application twice; adopted leases the client does not report are
//	   re-sent under their fresh tags;
//	   A reported delivery the session neither holds nor adopted is not
//	   reported stale in that first INFLIGHT: its ACK may have been applied
//	   just before the old process died, and the client's repeat of it is
//	   answered ok by the partition, which remembers which lease ACKed an
//	   offset (any other settle of it is judged by its lease as usual);
//	5. when the window ends, sessions not resumed are cleaned up as at a
//	   grace expiry: their leases go back to ready as releases (no retry
//	   used), and the store forgets them.
//
// Leases nobody adopts are released by their partition once the broker's
// recovered-lease grace (the same setting) has passed. Leases past their
// deadline are not adopted; they expire into ready as they would have.

// tagShift places a restored session's tags above any the client can hold
// from an earlier process (fewer than 2^40 deliveries per session and boot).
const tagShift = 40

// restore brings back the store's sessions; see above. Called by NewRegistry
// before the registry is shared.
func (r *Registry) restore() {
	st := r.cfg.Store
	sb, stable := r.cfg.Backend.(StableBackend)
	if stable {
		sb.ReserveSubIDs(st.NextSubID())
	}
	stored := st.Restored()
	if len(stored) == 0 {
		return
	}
	grace := r.cfg.RestartGraceMs
	if !stable || grace <= 0 {
		for _, x := range stored {
			r.storeErr(st.End(x.ClientID), "end", x.ClientID)
		}
		r.log.Info("sessions of the previous process not restored", "sessions", len(stored), "restart_grace_ms", grace, "stable_backend", stable)
		return
	}
	var subs, reclaimed, failed int
	for _, x := range stored {
		if x.OwnerID != r.cfg.OwnerID {
			// Another broker's identity (a copied data dir): it cannot
			// resume here.
			r.storeErr(st.End(x.ClientID), "end", x.ClientID)
			continue
		}
		s := newSession(r, x.ClientID, nil)
		s.tokenHash, s.restored, s.restoring, s.fromRestart = x.TokenHash, true, true, true
		s.principal = x.Principal
		s.lastTag = st.Boot() << tagShift
		s.detached.Store(true) // no new deliveries until the client is back
		s.inGrace = true
		r.dormant.Add(1)
		r.sessions[x.ClientID] = s
		for _, sub := range x.Subs {
			req := protocol.Subscribe{Topic: sub.Topic, Group: sub.Group, Partition: sub.Partition, AckMode: sub.AckMode, Prefetch: sub.Prefetch,
				Cohort: sub.Cohort, Member: sub.Member}
			ss := &subState{id: sub.ID, autoAck: sub.AckMode == protocol.AckAuto, prefetch: sub.Prefetch, announced: true,
				cohort: sub.Cohort, member: sub.Member}
			if err := s.checkCohort(&req); err != nil {
				failed++
				r.log.Warn("subscription not restored", "client_id", x.ClientID, "sub_id", sub.ID, "topic", sub.Topic, "group", sub.Group, "err", err)
				r.storeErr(st.Unsubscribe(x.ClientID, sub.ID), "unsubscribe", x.ClientID)
				continue
			}
			bs, n, err := sb.SubscribeStable(&req, &subConsumer{s: s, st: ss}, StableSub{ID: sub.ID, OwnerPrefix: s.ownerPrefix(), Adopt: true})
			if err != nil {
				s.releaseMember(ss.member)
				failed++
				r.log.Warn("subscription not restored", "client_id", x.ClientID, "sub_id", sub.ID, "topic", sub.Topic, "group", sub.Group, "err", err)
				r.storeErr(st.Unsubscribe(x.ClientID, sub.ID), "unsubscribe", x.ClientID)
				continue
			}
			s.mu.Lock()
			ss.sub, ss.view, ss.parts = bs, bs.View(), bs.Partitions()
			s.subs[ss.id] = ss
			s.prefetches += uint64(ss.prefetch)
			s.mu.Unlock()
			r.subOpened(ss.id, bs, s)
			subs++
			reclaimed += n
		}
	}
	r.restored.Add(uint64(len(r.sessions)))
	r.reclaimed.Add(uint64(reclaimed))
	r.windowOpen = true
	r.windowStop = r.cfg.AfterFunc(time.Duration(grace)*time.Millisecond, r.windowEnded)
	r.log.Info("restart window started", "restart_grace_ms", grace, "sessions", len(r.sessions),
		"subscriptions", subs, "subscriptions_failed", failed, "leases_reclaimed", reclaimed)
}

// windowEnded cleans up the restored sessions nobody resumed.
func (r *Registry) windowEnded() {
	r.mu.Lock()
	r.windowOpen = false
	var left []*Session
	for _, s := range r.sessions {
		if s.restored {
			left = append(left, s)
		}
	}
	r.mu.Unlock()
	released := 0
	for _, s := range left {
		released += s.cleanup("restart window ended")
	}
	r.restartExpired.Add(uint64(len(left)))
	r.restartReleased.Add(uint64(released))
	r.log.Info("restart window ended", "resumed", r.resumedAfterRestart.Load(), "not_resumed", len(left), "leases_released", released)
}

// ownerPrefix is the stable part of the lease owner of s's subscriptions:
// the broker's owner id and the client id. The backend appends the
// subscription id, which is never reused.
func (s *Session) ownerPrefix() string { return s.reg.cfg.OwnerID + "/" + s.clientID }

// restoredTokenOK reports whether token is the one whose hash the store
// kept for s (a restored session that has not resumed yet).
func (s *Session) restoredTokenOK(token []byte) bool {
	h := sha256.Sum256(token)
	return subtle.ConstantTimeCompare(h[:], s.tokenHash[:]) == 1
}

// adoptedFor finds the adopted, not yet claimed delivery that ref names.
func (s *Session) adoptedForLocked(ref *protocol.LeaseRef) (uint64, tagEntry, bool) {
	if ref == nil || ref.LeaseID == 0 {
		return 0, tagEntry{}, false
	}
	for tag, e := range s.tags {
		if e.adopted && e.matches(ref) {
			return tag, e, true
		}
	}
	return 0, tagEntry{}, false
}
