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

// Broker is a Sinew broker at one address.
type Broker struct {
	name string
	addr string
	opts []sinew.Option
	// cohort, when set, makes every consumer a member of this cohort
	// (each connection is its own client, so its own member).
	cohort string
}

// SetCohort makes the consumers of later Connects members of cohort name
// ("" for plain competing consumers).
func (b *Broker) SetCohort(name string) { b.cohort = name }

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

// Remove deletes topic's queue and its messages: `sinew bench` calls it
// for the queue it created for the run.
func (b *Broker) Remove(ctx context.Context, topic string) error {
	c, err := b.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.DeleteQueue(ctx, topic, ""); err != nil {
		return fmt.Errorf("sinewadapter: delete %s: %w", topic, err)
	}
	return nil
}

// Connect implements benchkit.Broker.
func (b *Broker) Connect(ctx context.Context) (benchkit.Conn, error) {
	c, err := b.dial(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{c: c, cohort: b.cohort}, nil
}

func (b *Broker) dial(ctx context.Context) (*sinew.Client, error) {
	opts := append([]sinew.Option{sinew.WithClientName("sinew-bench")}, b.opts...)
	c, err := sinew.Dial(ctx, b.addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("sinewadapter: dial %s: %w", b.addr, err)
	}
	return c, nil
}

type conn struct {
	c      *sinew.Client
	cohort string
}

// Publish returns once the broker confirmed the message durable.
func (c *conn) Publish(ctx context.Context, topic string, body []byte) error {
	_, err := c.c.Publish(ctx, topic, body)
	return err
}

// Consume subscribes with manual acknowledgement and prefetch; every message is
// completed with CompleteAsync after handle returns, so the pump never waits for
// a settle to become durable (the SDK sends the queued settles in one frame).
// The first settle that fails is kept and returned by Stop.
func (c *conn) Consume(ctx context.Context, topic string, prefetch int, handle func([]byte)) (benchkit.Subscription, error) {
	opts := []sinew.SubscribeOption{sinew.WithPrefetch(prefetch)}
	if c.cohort != "" {
		opts = append(opts, sinew.WithCohort(c.cohort))
	}
	s, err := c.c.Subscribe(ctx, topic, opts...)
	if err != nil {
		return nil, fmt.Errorf("sinewadapter: subscribe %s: %w", topic, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	sub := &sub{s: s, cancel: cancel}
	sub.wg.Go(func() {
		// pending holds settles not yet known durable, oldest first; their
		// outcomes are collected as they resolve. The broker frees prefetch
		// credit only for durable settles, so about prefetch of them can be
		// pending; pendingMax is a backstop beyond which the oldest go unchecked.
		var pending []*sinew.SettleFuture
		pendingMax := 2*prefetch + 64
		for {
			select {
			case <-runCtx.Done():
				return
			case m, ok := <-s.Messages():
				if !ok {
					return
				}
				handle(m.Body)
				pending = sub.reap(append(pending, m.CompleteAsync()), pendingMax)
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

// reap drops the settles at the front of pending that have resolved, keeping the
// first failure, and drops unresolved ones too while more than keepMax remain.
func (s *sub) reap(pending []*sinew.SettleFuture, keepMax int) []*sinew.SettleFuture {
	for len(pending) > 0 {
		select {
		case <-pending[0].Done():
			if err := pending[0].Err(); err != nil {
				s.keep(err)
			}
		default:
			if len(pending) <= keepMax {
				return pending
			}
		}
		pending = pending[1:]
	}
	return pending
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
