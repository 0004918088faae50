package sinew

import (
	"fmt"

	"github.com/sinewmq/sinew/internal/cohort"
	"github.com/sinewmq/sinew/protocol"
)

// WithCohort makes the subscription a member of cohort name (a consumer
// group): the members of one cohort on one queue share its partitions, each
// partition delivered to one member at a time, in offset order, and a
// message retried with a delay comes back before anything of its partition
// that was not yet delivered. The broker spreads the partitions over the
// members (sticky, balanced by count) and moves one only after its previous
// member's leases on it ended; Assignments reports each partition that
// comes and goes. The member id is the client's (WithMemberID). A name is
// 1 to 128 bytes of A–Z a–z 0–9 . _ : -; anything else fails Subscribe
// with ErrInvalidArgument.
func WithCohort(name string) SubscribeOption { return func(c *subscribeConfig) { c.cohort = name } }

// WithMemberID sets the member id the client's cohort subscriptions use
// (WithCohort), 1 to 128 bytes of A–Z a–z 0–9 . _ : -. By default it is a
// random id drawn once per Client, kept through reconnects. A broker lets
// one session hold a member id at a time, so two clients never pass for one
// member: give each process its own id, or leave the default.
func WithMemberID(id string) Option { return func(o *options) { o.memberID = id } }

// MemberID returns the member id of the client's cohort subscriptions.
func (c *Client) MemberID() string { return c.o.memberID }

// Assignment tells a cohort subscription that partition Partition was
// assigned to it (Assigned) or revoked from it: the partition's deliveries
// come to this member from now on, or go elsewhere. Epoch is the
// partition's assignment epoch after the move (Message.Assignment carries
// the one a delivery was made under); a revoke the Client makes itself,
// because its session was lost and it subscribed again, carries the epoch
// of the assignment it held.
type Assignment struct {
	Partition uint32
	Epoch     uint64
	Assigned  bool
}

// assignmentBufferMax bounds the assignment events a subscription keeps for
// the application; when it is full the oldest is dropped
// (Subscription.AssignmentsDropped counts them).
const assignmentBufferMax = 256

// Assignments returns the partitions assigned to and revoked from a cohort
// subscription, as they happen. The channel is buffered (256 events); when
// the application does not read it the oldest events are dropped, and
// AssignmentsDropped counts them. A subscription without a cohort never
// sends anything on it. It is never closed: select on Done as well.
func (s *Subscription) Assignments() <-chan Assignment { return s.assigns }

// AssignmentsDropped counts the assignment events dropped because
// Assignments was not read.
func (s *Subscription) AssignmentsDropped() uint64 { return s.assignsDropped.Load() }

// noteAssignment records an ASSIGNMENT for the subscription it arrived on
// and hands it to the application.
func (s *Subscription) noteAssignment(a Assignment) {
	s.assignMu.Lock()
	if a.Assigned {
		if s.heldParts == nil {
			s.heldParts = make(map[uint32]uint64)
		}
		s.heldParts[a.Partition] = a.Epoch
	} else {
		delete(s.heldParts, a.Partition)
	}
	s.assignMu.Unlock()
	s.assigned(a)
}

// revokeHeld tells the application that every partition this subscription
// was assigned is no longer its: the broker's subscription it was assigned
// to is gone (the session ended, or the subscription is made again), and
// the new one hears of its own assignments afresh.
func (s *Subscription) revokeHeld() {
	s.assignMu.Lock()
	held := s.heldParts
	s.heldParts = nil
	s.assignMu.Unlock()
	for p, epoch := range held {
		s.assigned(Assignment{Partition: p, Epoch: epoch})
	}
}

// assigned hands an assignment event to the application, dropping the
// oldest when the buffer is full.
func (s *Subscription) assigned(a Assignment) {
	if s.parent != nil {
		s.parent.assigned(a)
		return
	}
	for {
		select {
		case s.assigns <- a:
			return
		default:
		}
		select {
		case <-s.assigns:
			s.assignsDropped.Add(1)
		default:
		}
	}
}

// assignment routes an ASSIGNMENT to its subscription; one for a
// subscription the connection does not know is ignored.
func (e *endpoint) assignment(c *conn, b *protocol.Assignment) {
	c.mu.Lock()
	s := c.subs[b.SubID]
	c.mu.Unlock()
	if s == nil {
		return
	}
	s.noteAssignment(Assignment{Partition: b.Partition, Epoch: b.Epoch, Assigned: b.State == protocol.AssignmentAssigned})
}

// checkCohort validates a subscription's cohort and the client's member id.
func (c *Client) checkCohort(cfg *subscribeConfig) error {
	if cfg.cohort == "" {
		return nil
	}
	if err := cohort.ValidName(cfg.cohort); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if err := cohort.ValidMemberID(c.o.memberID); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	cfg.member = c.o.memberID
	return nil
}
