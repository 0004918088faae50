package sinewadapter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/benchkit"
)

// settlersMax bounds the goroutines completing messages for one consumer. The
// broker never has more than prefetch messages unsettled, so more than that
// would sit idle.
const settlersMax = 256

// Broker is a Sinew broker at one address.
type Broker struct {
	name string
	addr string
	opts []sinew.Option
}

// New returns a broker reached at addr ("127.0.0.1:7654"), reported as name.
// opts are passed to every sinew.Dial.
func New(name, addr string, opts ...sinew.Option) *Broker {
	return &Broker{name: name, addr: addr, opts: opts}
}

// Name implements benchkit.Broker.
func (b *Broker) Name() string { return b.name }

// Prepare implements benchkit.Broker: it declares topic with the broker's
// default settings (partitions, lease, retries).
func (b *Broker) Prepare(ctx context.Context, topic string) error {
	c, err := b.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.DeclareQueue(ctx, topic, sinew.QueueConfig{}); err != nil {
		return fmt.Errorf("sinewadapter: declare %s: %w", topic, err)
	}
	return nil
}

// Connect implements benchkit.Broker.
func (b *Broker) Connect(ctx context.Context) (benchkit.Conn, error) {
	c, err := b.dial(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{c: c}, nil
}

func (b *Broker) dial(ctx context.Context) (*sinew.Client, error) {
	opts := append([]sinew.Option{sinew.WithClientName("sinew-bench")}, b.opts...)
	c, err := sinew.Dial(ctx, b.addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("sinewadapter: dial %s: %w", b.addr, err)
	}
	return c, nil
}

type conn struct{ c *sinew.Client }

// Publish returns once the broker confirmed the message durable.
func (c *conn) Publish(ctx context.Context, topic string, body []byte) error {
	_, err := c.c.Publish(ctx, topic, body)
	return err
}

// Consume subscribes with manual acknowledgement and prefetch; every message is
// completed by the settler pool after handle returns.
func (c *conn) Consume(ctx context.Context, topic string, prefetch int, handle func([]byte)) (benchkit.Subscription, error) {
	s, err := c.c.Subscribe(ctx, topic, sinew.WithPrefetch(prefetch))
	if err != nil {
		return nil, fmt.Errorf("sinewadapter: subscribe %s: %w", topic, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	sub := &sub{s: s, cancel: cancel}
	settle := make(chan *sinew.Message, prefetch)
	var settlers sync.WaitGroup
	for range min(prefetch, settlersMax) {
		settlers.Go(func() {
			for m := range settle {
				// A failed complete only means a redelivery after the lease,
				// which the engine does not count twice in a measured phase
				// ending long before the lease; the first error is kept.
				if err := m.Complete(runCtx); err != nil && runCtx.Err() == nil {
					sub.keep(err)
				}
			}
		})
	}
	sub.wg.Go(func() {
		defer func() { close(settle); settlers.Wait() }()
		for {
			select {
			case <-runCtx.Done():
				return
			case m, ok := <-s.Messages():
				if !ok {
					return
				}
				handle(m.Body)
				settle <- m
			}
		}
	})
	return sub, nil
}

func (c *conn) Close() error { return c.c.Close() }

type sub struct {
	s      *sinew.Subscription
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu  sync.Mutex
	err error // first settle failure
}

func (s *sub) keep(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// unsubscribeTimeout bounds Stop's wait for the broker to end the subscription.
const unsubscribeTimeout = 10 * time.Second

// Stop unsubscribes, stops the pump and waits for pending settles.
func (s *sub) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), unsubscribeTimeout)
	defer cancel()
	uerr := s.s.Unsubscribe(ctx)
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if errors.Is(uerr, sinew.ErrClientClosed) {
		uerr = nil
	}
	return errors.Join(uerr, s.err)
}
