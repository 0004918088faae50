package session

import (
	"sync"

	"github.com/sinewmq/sinew/internal/cohort"
	"github.com/sinewmq/sinew/protocol"
)

// Cohort members. A subscription that names a cohort is a member of it under
// a member id. A session uses one member id (a second one is refused), kept
// for as long as it lives, through reconnects; and on a broker a member id
// belongs to one session at a time, so two clients never pass for one
// member: the partition gates admit by member id. A new session of the same
// principal that subscribes with a member id another session holds takes it
// over (a restarted process comes back with its configured id while its old
// session still waits out its grace): the older session's subscriptions
// under that id end first, with SUB_CLOSED code conflict, their leases
// released, and only then does the new one attach. With authentication on,
// a member id belongs to the principal that holds it: another principal
// gets permission_denied.

// AssignmentConsumer may be implemented by a Consumer: it is told when one
// partition of a cohort subscription was assigned to it or revoked from it.
// It must not block.
type AssignmentConsumer interface {
	Assignment(sub Subscription, partition uint32, epoch uint64, assigned bool)
}

// Assignment implements AssignmentConsumer: the client hears of it by an
// ASSIGNMENT push (held until the subscription is announced, and while the
// session is dormant like any push).
func (c *subConsumer) Assignment(sub Subscription, partition uint32, epoch uint64, assigned bool) {
	c.s.assignment(c.st, sub, partition, epoch, assigned)
}

func (s *Session) assignment(st *subState, sub Subscription, partition uint32, epoch uint64, assigned bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.closed || s.state == stateClosed {
		return
	}
	if st.sub == nil {
		st.sub, st.id = sub, sub.ID()
	}
	state := protocol.AssignmentRevoked
	if assigned {
		state = protocol.AssignmentAssigned
	}
	o := Outbound{Body: &protocol.Assignment{SubID: st.id, Partition: partition, Epoch: epoch, State: state}}
	if !st.announced {
		s.holdEarlyLocked(st, o)
		return
	}
	s.emitLocked(o)
}

// memberClaim is who holds a member id on this broker.
type memberClaim struct {
	clientID  string
	principal string
	subs      int
}

// members is the registry's table of member ids. Its mutex is a leaf: it
// is taken under Session.mu and never takes another lock.
type members struct {
	mu sync.Mutex
	m  map[string]*memberClaim
}

// memberTakeoversMax bounds the takeovers one subscribe tries: two sessions
// that keep taking one id from each other give up with conflict.
const memberTakeoversMax = 3

// checkCohort validates req's cohort fields for session s and claims its
// member id for one more subscription, taking it over from another session
// of the same principal (see above). The caller calls releaseMember when
// that subscription ends (or was not opened after all).
func (s *Session) checkCohort(req *protocol.Subscribe) error {
	for range memberTakeoversMax {
		holder, err := s.claimMember(req)
		if holder == "" {
			return err
		}
		s.reg.takeOverMember(holder, req.Member)
	}
	return protocol.Errorf(protocol.CodeConflict, "member id %q is held by another session", req.Member)
}

// claimMember is one attempt of checkCohort: it returns the client id of
// another session of the same principal that holds the id, or the outcome.
func (s *Session) claimMember(req *protocol.Subscribe) (string, error) {
	if req.Cohort == "" && req.Member == "" {
		return "", nil
	}
	if err := cohort.ValidName(req.Cohort); err != nil {
		return "", protocol.Errorf(protocol.CodeBadRequest, "%v", err)
	}
	if err := cohort.ValidMemberID(req.Member); err != nil {
		return "", protocol.Errorf(protocol.CodeBadRequest, "%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.member != "" && s.member != req.Member {
		return "", protocol.Errorf(protocol.CodeBadRequest, "this session is member %q; a session uses one member id", s.member)
	}
	ms := &s.reg.members
	ms.mu.Lock()
	defer ms.mu.Unlock()
	c := ms.m[req.Member]
	switch {
	case c == nil:
		if ms.m == nil {
			ms.m = make(map[string]*memberClaim)
		}
		c = &memberClaim{clientID: s.clientID, principal: s.principal}
		ms.m[req.Member] = c
	case c.clientID != s.clientID && c.principal != s.principal:
		return "", protocol.Errorf(protocol.CodePermissionDenied, "member id %q belongs to another user", req.Member)
	case c.clientID != s.clientID:
		return c.clientID, nil
	}
	c.subs++
	s.member = req.Member
	return "", nil
}

// takeOverMember ends the subscriptions of session clientID that use member
// id member, releasing their leases, so that another session can use it. A
// holder that no longer exists loses its claim.
func (r *Registry) takeOverMember(clientID, member string) {
	r.mu.Lock()
	o := r.sessions[clientID]
	r.mu.Unlock()
	if o == nil {
		ms := &r.members
		ms.mu.Lock()
		if c := ms.m[member]; c != nil && c.clientID == clientID {
			delete(ms.m, member)
		}
		ms.mu.Unlock()
		return
	}
	o.mu.Lock()
	var subs []*subState
	for _, st := range o.subs {
		if st.member == member && !st.closed && st.sub != nil {
			subs = append(subs, st)
		}
	}
	o.mu.Unlock()
	err := protocol.Errorf(protocol.CodeConflict, "member id %q was taken over by a newer session", member)
	for _, st := range subs {
		st.sub.Close()
		o.backendClosed(st, st.sub, protocol.SubClosedError, err)
	}
	o.logger().Info("cohort member taken over by a newer session", "member", member, "subscriptions", len(subs))
}

// releaseMember gives back one subscription's claim on member.
func (s *Session) releaseMember(member string) {
	if member == "" {
		return
	}
	ms := &s.reg.members
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if c := ms.m[member]; c != nil && c.clientID == s.clientID {
		if c.subs--; c.subs <= 0 {
			delete(ms.m, member)
		}
	}
}

// cohortsOf lists the cohort of each listed RECONCILE subscription by id.
func cohortsOf(req *protocol.Reconcile) map[uint64]protocol.SubCohort {
	if len(req.Cohorts) == 0 {
		return nil
	}
	m := make(map[uint64]protocol.SubCohort, len(req.Cohorts))
	for _, c := range req.Cohorts {
		m[c.SubID] = c
	}
	return m
}
