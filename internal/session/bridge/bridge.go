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

func (x backend) DeleteQueue(ctx context.Context, d *protocol.DeleteQueue) error {
	return x.b.Delete(ctx, d)
}

func (x backend) PurgeQueue(p *protocol.PurgeQueue, done func(protocol.PurgeOK, error)) {
	x.b.Purge(p, done)
}

func (x backend) Subscribe(req *protocol.Subscribe, c session.Consumer) (session.Subscription, error) {
	var bc broker.Consumer = consumer{c}
	if p, ok := c.(session.Pauser); ok {
		bc = pausingConsumer{consumer{c}, p}
	}
	s, err := x.b.Subscribe(req, bc)
	if err != nil {
		return nil, err
	}
	return sub{s}, nil
}

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
	k.c.Deliver(sub{s}, session.Delivery(d))
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
