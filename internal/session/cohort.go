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
// member: the partition gates admit by member id. With authentication on,
// the principal that holds an id is told apart from another one using it,
// which gets permission_denied instead of conflict.

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

// checkCohort validates req's cohort fields for session s and claims its
// member id for one more subscription. The caller calls releaseMember when
// that subscription ends (or was not opened after all).
func (s *Session) checkCohort(req *protocol.Subscribe) error {
	if req.Cohort == "" && req.Member == "" {
		return nil
	}
	if err := cohort.ValidName(req.Cohort); err != nil {
		return protocol.Errorf(protocol.CodeBadRequest, "cohort %q: %v", req.Cohort, err)
	}
	if err := cohort.ValidMemberID(req.Member); err != nil {
		return protocol.Errorf(protocol.CodeBadRequest, "member %q: %v", req.Member, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.member != "" && s.member != req.Member {
		return protocol.Errorf(protocol.CodeBadRequest, "this session is member %q; a session uses one member id", s.member)
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
		return protocol.Errorf(protocol.CodePermissionDenied, "member id %q belongs to another user", req.Member)
	case c.clientID != s.clientID:
		return protocol.Errorf(protocol.CodeConflict, "member id %q is held by another session; it is free once that session ends", req.Member)
	}
	c.subs++
	s.member = req.Member
	return nil
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
