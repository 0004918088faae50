package natsjs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sinewmq/sinew/internal/benchkit"
)

const (
	// consumerName is the one durable consumer every Consume call shares: a work
	// queue stream allows only one consumer per subject, and sharing it spreads
	// messages across the benchmark's connections like a worker pool.
	consumerName = "bench"
	// ackPendingMax bounds unacknowledged messages across all of the consumer's
	// pullers; each puller's own bound is its prefetch.
	ackPendingMax = 65536
	opTimeout     = 10 * time.Second
)

// Broker is a NATS server with JetStream enabled.
type Broker struct {
	name string
	url  string
}

// New returns a broker reached at url ("nats://127.0.0.1:4222"), reported as name.
func New(name, url string) *Broker { return &Broker{name: name, url: url} }

// Name implements benchkit.Broker.
func (b *Broker) Name() string { return b.name }

// Prepare implements benchkit.Broker: it creates a file-backed work-queue stream
// named after topic, capturing the subject topic, replacing any old one.
func (b *Broker) Prepare(ctx context.Context, topic string) error {
	c, err := b.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	err = c.js.DeleteStream(ctx, topic)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("natsjs: delete stream %s: %w", topic, err)
	}
	_, err = c.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:      topic,
		Subjects:  []string{topic},
		Storage:   jetstream.FileStorage,
		Retention: jetstream.WorkQueuePolicy,
		Replicas:  1,
	})
	if err != nil {
		return fmt.Errorf("natsjs: create stream %s: %w", topic, err)
	}
	return nil
}

// Connect implements benchkit.Broker.
func (b *Broker) Connect(context.Context) (benchkit.Conn, error) { return b.dial() }

func (b *Broker) dial() (*conn, error) {
	nc, err := nats.Connect(b.url, nats.Name("sinew-bench"), nats.Timeout(opTimeout))
	if err != nil {
		return nil, fmt.Errorf("natsjs: connect %s: %w", b.url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("natsjs: jetstream: %w", err)
	}
	return &conn{nc: nc, js: js}, nil
}

type conn struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// Publish waits for the stream's PubAck. It goes through PublishAsync, the
// client's pipelined path (one shared reply subscription), rather than the
// request-per-publish Publish, so the client is not what limits NATS.
func (c *conn) Publish(ctx context.Context, topic string, body []byte) error {
	f, err := c.js.PublishAsync(topic, body)
	if err != nil {
		return fmt.Errorf("natsjs: publish: %w", err)
	}
	t := time.NewTimer(opTimeout)
	defer t.Stop()
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return fmt.Errorf("natsjs: publish: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("natsjs: publish: no PubAck within %v", opTimeout)
	}
}

// Consume pulls from the shared durable consumer, at most prefetch messages
// buffered, and acknowledges each message after handle returns.
func (c *conn) Consume(ctx context.Context, topic string, prefetch int, handle func([]byte)) (benchkit.Subscription, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	cons, err := c.js.CreateOrUpdateConsumer(ctx, topic, jetstream.ConsumerConfig{
		Durable:       consumerName,
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: ackPendingMax,
	})
	if err != nil {
		return nil, fmt.Errorf("natsjs: consumer on %s: %w", topic, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		handle(m.Data())
		_ = m.Ack() // a lost ack only means a redelivery, which the engine ignores
	}, jetstream.PullMaxMessages(prefetch))
	if err != nil {
		return nil, fmt.Errorf("natsjs: consume %s: %w", topic, err)
	}
	return sub{cc}, nil
}

func (c *conn) Close() error {
	c.nc.Close()
	return nil
}

type sub struct{ cc jetstream.ConsumeContext }

func (s sub) Stop() error {
	s.cc.Stop()
	<-s.cc.Closed()
	return nil
}
