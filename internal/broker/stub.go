package broker

import (
	"context"
	"strconv"
	"sync/atomic"

	"github.com/sinewmq/sinew/protocol"
)

func itoa(i int) string { return strconv.Itoa(i) }

// Broker is the registry of queues and subscriptions.
type Broker struct {
	cfg   Config
	ready atomic.Bool
}

// Open recovers every queue and partition under cfg.DataDir.
func Open(cfg Config) (*Broker, error) {
	b := &Broker{cfg: cfg}
	b.ready.Store(true)
	return b, nil
}

// Close stops partitions, writes final checkpoints and closes logs.
func (b *Broker) Close() error { return nil }

// Declare creates a queue or checks an existing one.
func (b *Broker) Declare(ctx context.Context, d *protocol.DeclareQueue) (protocol.DeclareOK, error) {
	return protocol.DeclareOK{}, protocol.Errorf(protocol.CodeInternal, "not implemented")
}

// Publish enqueues p asynchronously; done is called exactly once, from a
// partition goroutine, after the record is durable or with an error. done
// must not block. The broker copies what it keeps; the caller may reuse p
// after Publish returns.
func (b *Broker) Publish(p *protocol.Publish, done func(protocol.PublishOK, error)) {
	done(protocol.PublishOK{}, protocol.Errorf(protocol.CodeInternal, "not implemented"))
}

// Subscribe attaches c to one partition of a queue, or to all of them when
// req.Partition < 0.
func (b *Broker) Subscribe(req *protocol.Subscribe, c Consumer) (*Subscription, error) {
	return nil, protocol.Errorf(protocol.CodeInternal, "not implemented")
}

// Stats returns per-queue and per-partition counters.
func (b *Broker) Stats() Stats { return Stats{} }

// Ready reports whether the broker has recovered and is serving.
func (b *Broker) Ready() bool { return b.ready.Load() }

// Subscription is one consumer's attachment to a queue.
type Subscription struct {
	id   uint64
	view protocol.SubView
}

// ID returns the broker-assigned subscription id.
func (s *Subscription) ID() uint64 { return s.id }

// View describes the subscription: topic, group, partition (-1 = all), ack
// mode and the prefetch in force.
func (s *Subscription) View() protocol.SubView { return s.view }

// Settle acks, requeues or fails one lease; see the package documentation.
func (s *Subscription) Settle(kind protocol.Op, partition uint32, offset, leaseID uint64, delayMs int64, done func(protocol.Code)) {
	done(protocol.CodeInternal)
}

// Close detaches the subscription; its leases go back to ready at once.
func (s *Subscription) Close() {}
