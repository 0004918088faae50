package workload

import (
	"context"
	"errors"
	"sort"

	"github.com/sinewmq/sinew/protocol"
	"github.com/sinewmq/sinew/test/chaos/checker"
)

// producer publishes sequence numbers 1..count of one producer id, at most
// window unconfirmed at once, and resends every unconfirmed one with the same
// producer id and sequence after a reconnect or a retryable error, so the
// broker can tell the resend from a new message.
type producer struct {
	cfg   *Config
	name  string
	stats *Stats
	index int

	next    uint64   // next fresh sequence number
	retry   []uint64 // sent, not confirmed, to send again
	given   int      // sequences abandoned after a non-retryable error
	pending map[uint64]uint64
}

type reply struct {
	req  uint64
	body protocol.Body
}

func (p *producer) run(ctx context.Context) {
	p.next = 1
	for fails := 0; ctx.Err() == nil && !p.finished(); {
		c, err := dial(ctx, p.cfg, p.cfg.Addr, p.name, protocol.ResumeIdentity{})
		if err != nil {
			p.stats.add(func(s *Counters) { s.DialFailures++ })
			if !backoff(ctx, fails) {
				return
			}
			fails++
			continue
		}
		fails = 0
		p.stats.add(func(s *Counters) { s.Connects++ })
		p.serve(ctx, c)
		c.close()
	}
}

func (p *producer) finished() bool {
	return p.next > p.cfg.MessagesPerProducer && len(p.retry) == 0 && len(p.pending) == 0
}

// serve runs one connection until it fails, ctx ends or every sequence is settled.
func (p *producer) serve(ctx context.Context, c *wconn) {
	replies := make(chan reply, p.cfg.PublishWindow+8)
	readErr := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	go c.heartbeat(stop)
	go func() {
		for {
			h, body, err := c.next()
			if err != nil {
				readErr <- err
				return
			}
			switch body.(type) {
			case *protocol.PublishOK, *protocol.ErrorBody:
			default:
				continue // heartbeats and pushes carry no publish result
			}
			select {
			case replies <- reply{h.RequestID, body}:
			case <-stop:
				return
			}
		}
	}()
	defer func() {
		// Whatever was in flight on this connection is unknown: send it again.
		for _, seq := range p.pending {
			p.retry = append(p.retry, seq)
		}
		p.pending = nil
		sort.Slice(p.retry, func(i, j int) bool { return p.retry[i] < p.retry[j] })
	}()
	p.pending = make(map[uint64]uint64)
	pause := false // set after a retryable refusal: wait for a reply before sending more
	for {
		for !pause && len(p.pending) < p.cfg.PublishWindow {
			seq, ok := p.take()
			if !ok {
				break
			}
			if err := p.publish(c, seq); err != nil {
				p.retry = append(p.retry, seq)
				c.close()
				<-readErr
				return
			}
		}
		if p.finished() {
			return
		}
		select {
		case <-ctx.Done():
			c.close()
			return
		case <-readErr:
			return
		case r := <-replies:
			seq, ok := p.pending[r.req]
			if !ok {
				continue // a reply to a PING or an unsolicited frame
			}
			delete(p.pending, r.req)
			pause = false
			switch m := r.body.(type) {
			case *protocol.PublishOK:
				p.cfg.Checker.Confirmed(checker.ID{Producer: p.name, Seq: seq})
				p.stats.add(func(s *Counters) { s.Confirms++ })
			case *protocol.ErrorBody:
				p.stats.add(func(s *Counters) { s.PublishErrors[m.Code.String()]++ })
				if m.Code.Retryable() {
					p.retry = append(p.retry, seq)
					if len(p.pending) == 0 {
						// Nothing else will wake us: back off before the resend.
						if !backoff(ctx, 2) {
							return
						}
					} else {
						pause = true
					}
				} else {
					p.given++
				}
				if m.Fatal {
					c.close()
					<-readErr
					return
				}
			}
		}
	}
}

// take returns the next sequence to send: a resend first, then a fresh one.
func (p *producer) take() (uint64, bool) {
	if len(p.retry) > 0 {
		seq := p.retry[0]
		p.retry = p.retry[1:]
		return seq, true
	}
	if p.next > p.cfg.MessagesPerProducer {
		return 0, false
	}
	seq := p.next
	p.next++
	return seq, true
}

var errBody = errors.New("workload: body")

func (p *producer) publish(c *wconn, seq uint64) error {
	id := checker.ID{Producer: p.name, Seq: seq}
	body, err := checker.AppendBody(nil, id, p.cfg.PaddingBytes)
	if err != nil {
		return errors.Join(errBody, err)
	}
	p.cfg.Checker.Attempted(id)
	req, err := c.send(0, &protocol.Publish{
		Topic: p.cfg.Topic, Partition: -1, ProducerID: p.name, ProducerSeq: seq, Body: body,
	})
	if err != nil {
		return err
	}
	p.pending[req] = seq
	p.stats.add(func(s *Counters) { s.Publishes++ })
	return nil
}
