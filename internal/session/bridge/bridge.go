// Package bridge adapts *broker.Broker to session.Backend, so that the session and
// server packages depend on a small interface (and test against fakes) while the
// binary runs them on the real broker. It holds no state and starts no goroutines.
package bridge

import (
	"context"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/protocol"
)

// New returns b as a session.Backend.
func New(b *broker.Broker) session.Backend { return backend{b} }

type backend struct{ b *broker.Broker }

func (x backend) Declare(ctx context.Context, d *protocol.DeclareQueue) (protocol.DeclareOK, error) {
	return x.b.Declare(ctx, d)
}

func (x backend) Publish(p *protocol.Publish, done func(protocol.PublishOK, error)) {
	x.b.Publish(p, done)
}

// PublishChecked implements session.CreateGuard.
func (x backend) PublishChecked(p *protocol.Publish, mayCreate session.MayCreate, done func(protocol.PublishOK, error)) {
	x.b.PublishChecked(p, broker.CreateCheck(mayCreate), done)
}

func (x backend) DeleteQueue(ctx context.Context, d *protocol.DeleteQueue) error {
	return x.b.Delete(ctx, d)
}

func (x backend) PurgeQueue(p *protocol.PurgeQueue, done func(protocol.PurgeOK, error)) {
	x.b.Purge(p, done)
}

// Metadata implements session.MetadataBackend.
func (x backend) Metadata(m *protocol.Metadata) (protocol.MetadataResult, error) {
	return x.b.Metadata(m.Topic, m.Group)
}

func (x backend) Subscribe(req *protocol.Subscribe, c session.Consumer) (session.Subscription, error) {
	s, _, err := x.SubscribeStable(req, c, session.StableSub{})
	return s, err
}

// SubscribeStable implements session.StableBackend.
func (x backend) SubscribeStable(req *protocol.Subscribe, c session.Consumer, st session.StableSub) (session.Subscription, int, error) {
	var bc broker.Consumer = consumer{c}
	if p, ok := c.(session.Pauser); ok {
		bc = pausingConsumer{consumer{c}, p}
	}
	s, err := x.b.SubscribeWith(req, bc, broker.SubscribeOptions{ID: st.ID, OwnerPrefix: st.OwnerPrefix, Adopt: st.Adopt,
		MayCreate: broker.CreateCheck(st.MayCreate)})
	if err != nil {
		return nil, 0, err
	}
	return sub{s}, s.Adopted(), nil
}

// ReserveSubIDs implements session.StableBackend.
func (x backend) ReserveSubIDs(next uint64) { x.b.ReserveSubIDs(next) }

func (x backend) Ready() bool { return x.b.Ready() }

// sub is a value wrapping the pointer, so two wrappers of one subscription compare
// equal as interfaces.
type sub struct{ *broker.Subscription }

type consumer struct{ c session.Consumer }

// pausingConsumer is a consumer whose session can pause it
// (broker.PausableConsumer).
type pausingConsumer struct {
	consumer
	p session.Pauser
}

func (k pausingConsumer) RoomBytes() int64 { return k.p.RoomBytes() }

func (k consumer) Deliver(s *broker.Subscription, d broker.Delivery) {
	k.c.Deliver(sub{s}, d)
}

// LeaseEnded implements broker.LeaseEndedConsumer for consumers that
// implement session.LeaseEnder.
func (k consumer) LeaseEnded(s *broker.Subscription, partition uint32, offset, leaseID uint64) {
	if le, ok := k.c.(session.LeaseEnder); ok {
		le.LeaseEnded(sub{s}, partition, offset, leaseID)
	}
}

func (k consumer) Closed(s *broker.Subscription, reason uint8, err error) {
	k.c.Closed(sub{s}, reason, err)
}

// Assignment implements broker.AssignmentConsumer for consumers that
// implement session.AssignmentConsumer.
func (k consumer) Assignment(s *broker.Subscription, partition uint32, epoch uint64, assigned bool) {
	if ac, ok := k.c.(session.AssignmentConsumer); ok {
		ac.Assignment(sub{s}, partition, epoch, assigned)
	}
}
