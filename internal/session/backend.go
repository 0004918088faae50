package session

import (
	"context"

	"github.com/sinewmq/sinew/internal/delivery"
	"github.com/sinewmq/sinew/protocol"
)

// Backend is the part of the broker that sessions and the server call. The real
// broker is adapted to it by package session/bridge; tests use small fakes.
type Backend interface {
	// Declare creates a queue or checks an existing one.
	Declare(ctx context.Context, d *protocol.DeclareQueue) (protocol.DeclareOK, error)
	// Publish enqueues p. done is called exactly once, possibly from another
	// goroutine, after the message is durable or with an error; it must not block.
	// The backend copies what it keeps.
	Publish(p *protocol.Publish, done func(protocol.PublishOK, error))
	// DeleteQueue removes a queue and everything in it; its subscriptions end
	// with SubClosedQueueDeleted. It returns once the removal is durable.
	DeleteQueue(ctx context.Context, d *protocol.DeleteQueue) error
	// PurgeQueue discards a queue's queued messages. done is called exactly
	// once, possibly from another goroutine, once the discards are durable or
	// with an error; it must not block.
	PurgeQueue(p *protocol.PurgeQueue, done func(protocol.PurgeOK, error))
	// Subscribe attaches c to a queue. c may receive deliveries before Subscribe
	// returns.
	Subscribe(req *protocol.Subscribe, c Consumer) (Subscription, error)
	// Ready reports whether the backend has recovered and serves requests.
	Ready() bool
}

// OwnerChecker may be implemented by a Subscription whose partitions are
// served by one node of a cluster at a time. Serves reports whether this
// node serves partition p now, under the epoch a delivery was made in (0:
// any). A session never sends a held delivery again (after a resume) that
// fails it: the lease is the partition's owner's to judge (it may have
// been settled through another node), and the client settles it there.
type OwnerChecker interface {
	Serves(partition uint32, epoch uint64) bool
}

// MetadataBackend may be implemented by a Backend that can say where a
// queue's partitions are served (METADATA). The server answers METADATA
// with unknown_op for a backend without it.
type MetadataBackend interface {
	Metadata(m *protocol.Metadata) (protocol.MetadataResult, error)
}

// StableBackend may be implemented by a Backend whose subscriptions can
// keep their identity across a restart; the registry then uses
// SubscribeStable for every subscription, and restores the sessions of its
// Config.Store through it.
type StableBackend interface {
	// SubscribeStable is Subscribe with the identity in st. With st.Adopt
	// it also takes back the leases recovered under that identity and
	// delivers them to c (same lease id and attempt) before it returns,
	// and reports how many.
	SubscribeStable(req *protocol.Subscribe, c Consumer, st StableSub) (Subscription, int, error)
	// ReserveSubIDs keeps the ids of later subscriptions at or above
	// next.
	ReserveSubIDs(next uint64)
}

// MayCreate decides whether a request may create the queue (topic, group)
// it names when that queue does not exist (creation on first use): nil
// lets it, an error is the request's answer. A backend asks it at the
// moment it would create the queue, so a request to a queue that exists
// never asks. It must not block. A nil MayCreate allows.
type MayCreate func(topic, group string) error

// CreateGuard may be implemented by a Backend that creates queues on first
// use: PublishChecked is Publish where a missing queue is created only
// when mayCreate allows. The server publishes through it with the
// connection's permission check; subscriptions carry the same check in
// StableSub.MayCreate. The broker's bridge implements both.
type CreateGuard interface {
	PublishChecked(p *protocol.Publish, mayCreate MayCreate, done func(protocol.PublishOK, error))
}

// StableSub is a subscription's identity across restarts, and the check on
// whether opening it may create its queue.
type StableSub struct {
	// ID is the subscription id to use; 0 draws a fresh one.
	ID uint64
	// OwnerPrefix, with the id, names the subscription's leases in the
	// partition logs: owner id "/" client id, both stable.
	OwnerPrefix string
	// Adopt takes back the leases recovered under that name.
	Adopt bool
	// MayCreate, when set, decides whether the subscription may create its
	// queue on first use (see MayCreate). It is not part of the identity:
	// it rides here because every subscription a session opens on a
	// stable backend goes through SubscribeStable.
	MayCreate MayCreate
}

// Subscription is one consumer attachment inside the backend.
type Subscription interface {
	// ID is the backend-assigned subscription id, unique per process.
	ID() uint64
	// View describes the subscription (partition -1 = every partition).
	View() protocol.SubView
	// Partitions lists the partitions the subscription covers.
	Partitions() []uint32
	// Settle acks, requeues or fails one lease; done gets the outcome and must not
	// block.
	Settle(kind protocol.Op, partition uint32, offset, leaseID uint64, delayMs int64, done func(protocol.Code))
	// Close detaches the subscription; its leases go back to ready.
	Close()
}

// LeaseChecker may be implemented by a Subscription: LeaseCurrent reports
// whether a settle of offset in partition by leaseID would still take
// effect. A session resumed after a restart uses it to tell its client
// which of the deliveries it still holds are stale.
type LeaseChecker interface {
	LeaseCurrent(ctx context.Context, partition uint32, offset, leaseID uint64) (bool, error)
}

// Consumer receives a subscription's deliveries from backend goroutines. Neither
// method may block.
type Consumer interface {
	// Deliver hands over one leased message. Outstanding deliveries per
	// subscription never exceed its prefetch.
	Deliver(s Subscription, d Delivery)
	// Closed reports that the backend ended the subscription on its own.
	Closed(s Subscription, reason uint8, err error)
}

// LeaseEnder may be implemented by a Consumer that wants to hear when a lease
// it was delivered ends without its own settle (expired, released,
// dead-lettered). It is called from backend goroutines after the Deliver of
// that lease and must not block.
type LeaseEnder interface {
	LeaseEnded(s Subscription, partition uint32, offset, leaseID uint64)
}

// Delivery is one leased message (internal/delivery). Body, Key and
// Headers may be shared with other deliveries and are never modified.
type Delivery = delivery.Delivery

// Outbound is one frame waiting to be written.
type Outbound struct {
	Flags     uint16
	RequestID uint64
	Body      protocol.Body
	// AfterWrite, when set, runs on the writer goroutine once the frame was handed
	// to the socket (auto-ack, publish-credit release). It must not block. When the
	// frame is dropped instead, Dropped runs (if set).
	AfterWrite func()
	// Dropped runs when the frame will never be written (connection gone, session
	// closed). It must not block.
	Dropped func()
	// NotAfterMs, when not 0, is the Unix time in ms after which the frame
	// is dropped instead of written: a DELIVER whose lease ran out while it
	// waited (a replicated partition's new owner may have leased the
	// message again).
	NotAfterMs int64
}

// Drop runs o.Dropped if set: the frame will never be written.
func (o *Outbound) Drop() { o.drop() }

// drop runs o.Dropped if set.
func (o *Outbound) drop() {
	if o.Dropped != nil {
		o.Dropped()
	}
}

// isPush reports whether o survives a socket change: pushes that belong to the
// session (deliveries, subscription closes) rather than replies to one connection's
// requests.
func (o *Outbound) isPush() bool {
	switch o.Body.Op() {
	case protocol.OpDeliver, protocol.OpSubClosed:
		return true
	}
	return false
}

// Bytes estimates what o costs while it waits to be written: its encoded size
// (message body, key, headers and names for a DELIVER) plus frameOverheadBytes
// for the frame header and the bookkeeping around it. Writers and dormant
// buffers count it against their byte caps.
func (o *Outbound) Bytes() int {
	n := frameOverheadBytes
	if d, ok := o.Body.(*protocol.Deliver); ok {
		n += len(d.Body) + len(d.Key) + len(d.ContentType) + len(d.Topic) + len(d.Group)
		for _, h := range d.Headers {
			n += len(h.Key) + len(h.Value) + 8
		}
	}
	return n
}

// frameOverheadBytes is what Bytes charges every frame on top of its payload:
// the frame header and fixed fields, and the Outbound and body structs.
const frameOverheadBytes = 128

// Pauser is implemented by the Consumer a session hands to the backend.
// RoomBytes is how many more bytes of deliveries (in Outbound.Bytes) the
// session can take for the subscription now; at zero or below it is paused. A
// backend that honours it leases only what fits and resumes when the
// subscription's Wake (see Waker) is called. RoomBytes must not block.
type Pauser interface {
	RoomBytes() int64
}

// Waker may be implemented by a Subscription whose backend honours Pauser:
// Wake says that the consumer takes deliveries again. It must not block.
type Waker interface {
	Wake()
}

// Throttle may be implemented by a Sink whose queue is bounded in bytes (the
// server's writer). RoomBytes is what it can still take (zero or below while it
// is full); the session passes it on as its subscriptions' room. The sink calls
// the function given to SetOnDrain (on its own goroutine, holding none of its
// locks) when it has drained enough to take deliveries again. RoomBytes must
// not block.
type Throttle interface {
	RoomBytes() int64
	SetOnDrain(f func())
}

// Sink is the transport a session writes through: the server's connection writer.
type Sink interface {
	// Send queues o for writing and must not block. It returns false when the sink
	// no longer accepts frames; the caller then owns o again.
	Send(o Outbound) bool
	// Kick asks the transport to close, because another connection took the
	// session over. The transport later calls Session.Detach as usual.
	Kick()
}
