package benchkit

import (
	"context"
	"errors"
)

// Broker is one message broker under test as the workload engine sees it. An
// adapter maps these calls onto the broker's own client with the durability the
// comparison needs: a publish returns only once the broker has confirmed it, and a
// consumer acknowledges each message explicitly after handling it.
type Broker interface {
	// Name identifies the broker and its configuration in reports, for example
	// "sinew" or "nats-js-sync".
	Name() string
	// Prepare makes sure topic exists as a durable queue with the adapter's
	// documented settings. Engines give every run its own topic, so Prepare never
	// has to empty an existing queue.
	Prepare(ctx context.Context, topic string) error
	// Connect opens one client connection. The engine opens Config.Connections of
	// them and closes every one before Run returns.
	Connect(ctx context.Context) (Conn, error)
}

// Conn is one client connection to a broker.
type Conn interface {
	// Publish sends body to topic and returns once the broker confirmed it, or with
	// the error that prevented that. It is called from many goroutines at once: the
	// publish window is that many goroutines, each with one publish in flight.
	Publish(ctx context.Context, topic string, body []byte) error
	// Consume starts a consumer on topic with manual acknowledgement and at most
	// prefetch unacknowledged deliveries. The adapter calls handle once per delivery
	// (never concurrently for one Consume call) and acknowledges the message after
	// handle returns; body is only valid during the call.
	Consume(ctx context.Context, topic string, prefetch int, handle func(body []byte)) (Subscription, error)
	// Close releases the connection. Subscriptions on it end.
	Close() error
}

// Subscription is a running consumer.
type Subscription interface {
	// Stop ends the consumer; after it returns, handle is not called again.
	Stop() error
}

// ErrConfig reports an invalid workload configuration.
var ErrConfig = errors.New("benchkit: invalid configuration")

// ErrIncomplete reports a workload that ended before doing its work, for example a
// drain whose deadline passed before the prefilled messages were consumed. The
// Result returned with it still holds what was measured.
var ErrIncomplete = errors.New("benchkit: workload incomplete")
