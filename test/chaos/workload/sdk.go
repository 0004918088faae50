package workload

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/test/chaos/checker"
)

// The SDK variant of the workload exercises the Go client's own reconnect,
// resume, reconciliation and idempotent resend instead of the raw driver's.
// What it records is what the SDK reported: a Publish that returned nil, a
// Message received, a Complete that returned nil.

// sdkReconnect makes the client come back quickly after a broker restart.
var sdkReconnect = sinew.ReconnectPolicy{BaseDelay: 25 * time.Millisecond, MaxDelay: time.Second}

// sdkDial dials with the chaos reconnect policy, retrying (bounded by ctx)
// while the broker is away. In a cluster (cfg.Seeds) client i dials node i
// mod the nodes and knows the others as seeds.
func sdkDial(ctx context.Context, cfg *Config, i int, name string) (*sinew.Client, error) {
	addr := cfg.Addr
	opts := []sinew.Option{sinew.WithClientName(name), sinew.WithReconnect(sdkReconnect), sinew.WithDialer(cfg.Dial)}
	if len(cfg.Seeds) > 0 {
		addr = cfg.Seeds[i%len(cfg.Seeds)]
		opts = append(opts, sinew.WithSeeds(cfg.Seeds...))
	}
	return sinew.Dial(ctx, addr, opts...)
}

// sdkProducerRun publishes 1..MessagesPerProducer with PublishAsync, at most
// PublishWindow unconfirmed, resending a sequence whose publish failed.
func (p *producer) sdkRun(ctx context.Context) {
	c, err := sdkDial(ctx, p.cfg, p.index, p.name)
	if err != nil {
		p.stats.add(func(s *Counters) { s.DialFailures++ })
		return
	}
	defer c.Close()
	p.stats.add(func(s *Counters) { s.Connects++ })
	type inflight struct {
		seq uint64
		f   *sinew.PublishFuture
	}
	var window []inflight
	p.next = 1
	for ctx.Err() == nil {
		for len(window) < p.cfg.PublishWindow {
			seq, ok := p.take()
			if !ok {
				break
			}
			id := checker.ID{Producer: p.name, Seq: seq}
			body, err := checker.AppendBody(nil, id, p.cfg.PaddingBytes)
			if err != nil {
				return
			}
			p.cfg.Checker.Attempted(id)
			window = append(window, inflight{seq, c.PublishAsync(ctx, p.cfg.Topic, body, sinew.WithProducerSequence(p.name, seq))})
			p.stats.add(func(s *Counters) { s.Publishes++ })
		}
		if len(window) == 0 {
			return // everything confirmed
		}
		head := window[0]
		window = window[1:]
		_, err := head.f.Wait(ctx)
		switch {
		case err == nil:
			p.cfg.Checker.Confirmed(checker.ID{Producer: p.name, Seq: head.seq})
			p.stats.add(func(s *Counters) { s.Confirms++ })
		case ctx.Err() != nil:
			return
		default:
			p.stats.add(func(s *Counters) { s.PublishErrors[errName(err)]++ })
			p.retry = append(p.retry, head.seq)
			if !backoff(ctx, 2) {
				return
			}
		}
	}
}

// sdkRun consumes with manual ack through the SDK, completing each message
// from a goroutine (at most Prefetch at once, which the broker bounds anyway)
// and subscribing again whenever the subscription ends.
func (k *consumer) sdkRun(ctx context.Context) {
	c, err := sdkDial(ctx, k.cfg, k.index, k.name)
	if err != nil {
		k.stats.add(func(s *Counters) { s.DialFailures++ })
		return
	}
	k.stats.add(func(s *Counters) { s.Connects++ })
	var wg sync.WaitGroup
	defer func() { wg.Wait(); c.Close() }()
	sem := make(chan struct{}, max(int(k.cfg.Prefetch), 1))
	for fails := 0; ctx.Err() == nil; {
		sub, err := c.Subscribe(ctx, k.cfg.Topic, sinew.WithPrefetch(int(k.cfg.Prefetch)))
		if err != nil {
			k.stats.add(func(s *Counters) { s.ConnErrors++ })
			if !backoff(ctx, fails) {
				return
			}
			fails++
			continue
		}
		fails = 0
		for msg, err := range sub.All(ctx) {
			if err != nil {
				if ctx.Err() == nil {
					k.stats.add(func(s *Counters) { s.ConnErrors++ })
					if k.cfg.Logf != nil {
						k.cfg.Logf("%s: subscription ended: %v", k.name, err)
					}
				}
				break
			}
			at := k.cfg.sinceMs()
			k.stats.add(func(s *Counters) { s.Deliveries++ })
			id, derr := checker.DecodeBody(msg.Body)
			if derr != nil {
				k.cfg.Checker.Corrupt(fmt.Sprintf("partition %d offset %d attempt %d: %v", msg.Partition, msg.Offset, msg.Attempt, derr), at)
				continue
			}
			pos := checker.Pos{Partition: msg.Partition, Offset: msg.Offset}
			if k.cfg.Logf != nil && k.cfg.Checker.WasSettled(id) {
				k.cfg.Logf("%s (dialed node %d): %s delivered again after its ack was confirmed: p%d@%d attempt %d",
					k.name, k.index%max(len(k.cfg.Seeds), 1)+1, id, msg.Partition, msg.Offset, msg.Attempt)
			}
			k.cfg.Checker.DeliveredAttempt(id, pos, at, msg.Attempt)
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				k.stats.add(func(s *Counters) { s.Acks++ })
				err := msg.Complete(ctx)
				if err != nil && ctx.Err() == nil {
					k.stats.add(func(s *Counters) { s.AckErrors[errName(err)]++ })
				}
				switch {
				case err == nil:
					k.cfg.Checker.SettledAt(id, pos, k.cfg.sinceMs())
				case errors.Is(err, sinew.ErrConnectionLost) || errors.Is(err, sinew.ErrClientClosed) || ctx.Err() != nil:
					// Sent, result unknown: it may have been settled.
					k.cfg.Checker.AckInDoubt(id)
				case brokerCodeInDoubt(err):
					k.cfg.Checker.AckInDoubt(id)
				default:
					k.cfg.Checker.SettleRefused()
				}
			}()
		}
	}
}

// brokerCodeInDoubt reports whether err is a broker refusal that leaves the
// ack's outcome open (see inDoubtCode).
func brokerCodeInDoubt(err error) bool {
	var be *sinew.BrokerError
	return errors.As(err, &be) && inDoubtCode(be.Code)
}

// errName is a short label for a publish's or an ack's error in the counters.
func errName(err error) string {
	var be *sinew.BrokerError
	if errors.As(err, &be) {
		return be.Code.String()
	}
	for _, e := range []error{sinew.ErrConnectionLost, sinew.ErrNotConnected, sinew.ErrDisconnected, sinew.ErrClientClosed} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return "other"
}
