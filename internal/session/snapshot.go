package session

import (
	"cmp"
	"slices"
	"time"
)

// SessionView is a snapshot of one live session for operators.
type SessionView struct {
	ClientID string
	// Attached is false while the session is dormant, waiting out its
	// grace; GraceLeft is then the time until it ends.
	Attached  bool
	ConnID    uint64
	GraceLeft time.Duration
	// Inflight counts the unsettled deliveries (delivery tags) the session
	// holds; Pending the pushes buffered while no socket is attached.
	Inflight, Pending int
	Subscriptions     []SubscriptionView
}

// SubscriptionView is one open subscription of a session.
type SubscriptionView struct {
	SubID        uint64
	Topic, Group string
	Partition    int32 // -1: every partition
	Prefetch     uint32
	AutoAck      bool
	Inflight     int // unsettled deliveries of this subscription
}

// Sessions returns a snapshot of every live session, attached or dormant,
// ordered by client id. It takes each session's lock in turn, never two
// at once, so the views of different sessions are from slightly different
// instants.
func (r *Registry) Sessions() []SessionView {
	r.mu.Lock()
	ss := make([]*Session, 0, len(r.sessions))
	for _, s := range r.sessions {
		ss = append(ss, s)
	}
	r.mu.Unlock()
	now := r.cfg.Now()
	out := make([]SessionView, 0, len(ss))
	for _, s := range ss {
		v, ok := s.view(now)
		if ok {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b SessionView) int { return cmp.Compare(a.ClientID, b.ClientID) })
	return out
}

// view is the session's snapshot; false once it is closed.
func (s *Session) view(now time.Time) (SessionView, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == stateClosed {
		return SessionView{}, false
	}
	v := SessionView{ClientID: s.clientID, Attached: s.state == stateAttached, Inflight: len(s.tags), Pending: len(s.pending)}
	if v.Attached {
		v.ConnID = s.connID
	} else if s.inGrace {
		v.GraceLeft = max(s.graceUntil.Sub(now), 0)
	}
	perSub := make(map[*subState]int, len(s.subs))
	for _, t := range s.tags {
		perSub[t.st]++
	}
	for _, st := range s.subs {
		if st.closed {
			continue
		}
		v.Subscriptions = append(v.Subscriptions, SubscriptionView{SubID: st.id, Topic: st.view.Topic, Group: st.view.Group,
			Partition: st.view.Partition, Prefetch: st.prefetch, AutoAck: st.autoAck, Inflight: perSub[st]})
	}
	slices.SortFunc(v.Subscriptions, func(a, b SubscriptionView) int { return cmp.Compare(a.SubID, b.SubID) })
	return v, true
}
