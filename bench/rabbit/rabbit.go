package rabbit

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sinewmq/sinew/internal/benchkit"
)

const opTimeout = 10 * time.Second

// ErrNacked reports a publish the broker refused to confirm.
var ErrNacked = errors.New("rabbit: publish nacked")

// Broker is a RabbitMQ node.
type Broker struct {
	name string
	url  string
}

// New returns a broker reached at url ("amqp://guest:guest@127.0.0.1:5672/"),
// reported as name.
func New(name, url string) *Broker { return &Broker{name: name, url: url} }

// Name implements benchkit.Broker.
func (b *Broker) Name() string { return b.name }

// Prepare implements benchkit.Broker: it (re)declares topic as a quorum queue.
func (b *Broker) Prepare(_ context.Context, topic string) error {
	c, err := amqp.DialConfig(b.url, amqp.Config{Dial: amqp.DefaultDial(opTimeout)})
	if err != nil {
		return fmt.Errorf("rabbit: connect %s: %w", b.url, err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return fmt.Errorf("rabbit: channel: %w", err)
	}
	if _, err := ch.QueueDelete(topic, false, false, false); err != nil {
		return fmt.Errorf("rabbit: delete queue %s: %w", topic, err)
	}
	_, err = ch.QueueDeclare(topic, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		return fmt.Errorf("rabbit: declare quorum queue %s: %w", topic, err)
	}
	return nil
}

// Connect implements benchkit.Broker.
func (b *Broker) Connect(context.Context) (benchkit.Conn, error) {
	c, err := amqp.DialConfig(b.url, amqp.Config{Dial: amqp.DefaultDial(opTimeout)})
	if err != nil {
		return nil, fmt.Errorf("rabbit: connect %s: %w", b.url, err)
	}
	ch, err := c.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("rabbit: confirm channel: %w", err)
	}
	return &conn{c: c, pub: ch}, nil
}

type conn struct {
	c   *amqp.Connection
	pub *amqp.Channel
	seq atomic.Uint64 // consumer tags
}

// Publish sends a persistent message through the default exchange and waits for
// the broker's confirm.
func (c *conn) Publish(ctx context.Context, topic string, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	dc, err := c.pub.PublishWithDeferredConfirmWithContext(ctx, "", topic, false, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		Body:         body,
	})
	if err != nil {
		return fmt.Errorf("rabbit: publish: %w", err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("rabbit: confirm: %w", err)
	}
	if !ok {
		return ErrNacked
	}
	return nil
}

// Consume opens a channel with basic.qos prefetch and acknowledges each delivery
// after handle returns.
func (c *conn) Consume(_ context.Context, topic string, prefetch int, handle func([]byte)) (benchkit.Subscription, error) {
	ch, err := c.c.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbit: channel: %w", err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("rabbit: qos: %w", err)
	}
	tag := fmt.Sprintf("bench-%d", c.seq.Add(1))
	ds, err := ch.Consume(topic, tag, false, false, false, false, nil)
	if err != nil {
		ch.Close()
		return nil, fmt.Errorf("rabbit: consume %s: %w", topic, err)
	}
	s := &sub{ch: ch, tag: tag, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for d := range ds {
			handle(d.Body)
			_ = d.Ack(false) // a lost ack only means a redelivery, which the engine ignores
		}
	}()
	return s, nil
}

func (c *conn) Close() error { return c.c.Close() }

type sub struct {
	ch   *amqp.Channel
	tag  string
	done chan struct{}
}

// Stop cancels the consumer; the delivery channel closes once the broker
// confirms, which ends the goroutine. Closing the channel is the fallback.
func (s *sub) Stop() error {
	err := s.ch.Cancel(s.tag, false)
	select {
	case <-s.done:
	case <-time.After(opTimeout):
	}
	_ = s.ch.Close()
	<-s.done
	return err
}
