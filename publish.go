package sinew

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// PublishOption configures one publish.
type PublishOption func(*protocol.Publish)

// WithKey sets the partition key: messages with the same key go to the same
// partition, and are stored in the order they were published (see Publish
// order in the package documentation).
func WithKey(key []byte) PublishOption { return func(p *protocol.Publish) { p.Key = key } }

// WithHeader adds one header. Keys starting with "sinew." are reserved.
func WithHeader(key, value string) PublishOption {
	return func(p *protocol.Publish) { p.Headers = append(p.Headers, protocol.Header{Key: key, Value: value}) }
}

// WithHeaders adds headers.
func WithHeaders(hs ...Header) PublishOption {
	return func(p *protocol.Publish) {
		for _, h := range hs {
			p.Headers = append(p.Headers, protocol.Header{Key: h.Key, Value: h.Value})
		}
	}
}

// WithContentType sets the message's content type, such as "application/json".
func WithContentType(ct string) PublishOption {
	return func(p *protocol.Publish) { p.ContentType = ct }
}

// WithDelay delays delivery by d after the broker receives the message.
func WithDelay(d time.Duration) PublishOption {
	return func(p *protocol.Publish) { p.DelayMs = max(0, d.Milliseconds()) }
}

// WithNotBefore delays delivery until t (it takes precedence over WithDelay).
func WithNotBefore(t time.Time) PublishOption {
	return func(p *protocol.Publish) { p.NotBeforeMs = t.UnixMilli() }
}

// WithTTL dead-letters the message (reason "expired") if it is not delivered
// within d.
func WithTTL(d time.Duration) PublishOption {
	return func(p *protocol.Publish) { p.TTLMs = max(0, d.Milliseconds()) }
}

// WithGroup publishes to the queue's group g instead of the default group.
func WithGroup(g string) PublishOption { return func(p *protocol.Publish) { p.Group = g } }

// WithPartition publishes to partition n instead of letting the broker choose.
func WithPartition(n int) PublishOption { return func(p *protocol.Publish) { p.Partition = int32(n) } }

// WithProducerSequence replaces the producer id and sequence the Client
// stamps on a confirmed publish with the application's own, for an
// application that numbers its messages itself and resends them after its
// own restart: a broker that still remembers (id, seq) in the chosen
// partition stores nothing and answers with the original partition and
// offset and PublishResult.Duplicate set. The broker remembers each
// producer's highest 4,096 sequences per partition (more when the broker's
// limits.publish_inflight_max is larger), for a day (limits.dedup_idle_ms)
// after the producer's last publish; a sequence below that window fails with
// sequence_too_old instead of being stored again. The same (id, seq) must
// always be sent with the same body, key and partition choice. An empty id
// turns deduplication off for this publish. Publishes numbered this way are
// not ordered by the Client (see Publish order in the package
// documentation). PublishNoConfirm ignores it.
func WithProducerSequence(id string, seq uint64) PublishOption {
	return func(p *protocol.Publish) { p.ProducerID = id; p.ProducerSeq = seq }
}

// PublishResult says where a confirmed message landed.
type PublishResult struct {
	Partition uint32
	Offset    uint64
	Duplicate bool // a resend of an already stored (producer id, sequence)
}

// PublishFuture is the pending result of PublishAsync.
type PublishFuture struct {
	done chan struct{}
	res  PublishResult
	err  error
	// leave, when set, takes the publish out of its ordering lane
	// (order.go); it runs before done closes.
	leave func()
}

// Done is closed when the publish is confirmed or has failed.
func (f *PublishFuture) Done() <-chan struct{} { return f.done }

// Wait waits for the confirm. A ctx error only stops the waiting; the publish
// itself goes on.
func (f *PublishFuture) Wait(ctx context.Context) (PublishResult, error) {
	select {
	case <-f.done:
		return f.res, f.err
	case <-ctx.Done():
		return PublishResult{}, ctx.Err()
	}
}

// Result returns the outcome; call it after Done is closed.
func (f *PublishFuture) Result() (PublishResult, error) {
	select {
	case <-f.done:
		return f.res, f.err
	default:
		return PublishResult{}, fmt.Errorf("sinew: publish still pending")
	}
}

func (f *PublishFuture) resolve(b protocol.Body, err error) {
	if err == nil {
		if ok, isOK := b.(*protocol.PublishOK); isOK {
			f.res = PublishResult{Partition: ok.Partition, Offset: ok.Offset, Duplicate: ok.Duplicate}
		} else {
			err = fmt.Errorf("%w: %s in answer to PUBLISH", ErrProtocol, b.Op())
		}
	}
	f.err = err
	if f.leave != nil {
		f.leave()
	}
	close(f.done)
}

// Publish sends a message and returns once the broker has confirmed it durable.
// body must not be modified until Publish returns.
func (c *Client) Publish(ctx context.Context, topic string, body []byte, opts ...PublishOption) (PublishResult, error) {
	return c.PublishAsync(ctx, topic, body, opts...).Wait(ctx)
}

// PublishAsync sends a message without waiting for its confirm, so many can be
// in flight at once. It blocks while the broker's announced PublishInflightMax
// publishes (or 64 MiB of bodies) are unconfirmed, and while the client
// reconnects, until ctx ends, which fails the future. body must not be
// modified until the future is done.
//
// Publishes are idempotent by default. The Client stamps each one with its
// producer id (Client.ProducerID) and the next of its sequence numbers, and a
// publish whose connection breaks before its confirm is sent again, with the
// same id and sequence, on the next connection. The broker recognises the
// resend, across reconnects and across its own restarts, and answers it with
// the original partition and offset and PublishResult.Duplicate set instead
// of storing a second copy; see WithProducerSequence for the window it
// remembers. What is not deduplicated: a publish the application itself
// repeats (a new call is a new sequence), PublishNoConfirm, and a resend the
// broker no longer remembers (the producer idle for a day, or evicted from a
// full window, which the broker counts in /metrics).
func (c *Client) PublishAsync(ctx context.Context, topic string, body []byte, opts ...PublishOption) *PublishFuture {
	p := &protocol.Publish{Topic: topic, Partition: -1, Body: body, ProducerID: c.o.producerID}
	for _, o := range opts {
		o(p)
	}
	hinted := false
	if c.hintable(p) {
		// The partition the broker hinted in its last answer for this
		// queue, explicitly, so resends keep it (hint.go).
		if h, ok := c.hints.take(p.Topic, p.Group); ok {
			p.Partition, hinted = h, true
		}
	}
	f := &PublishFuture{done: make(chan struct{})}
	e := c.rt.endpointFor(ctx, p)
	size := len(body)
	if err := e.window.acquire(ctx, e.quit, size); err != nil {
		if !errors.Is(err, ErrClientClosed) || c.isClosed() || e == c.ep {
			f.resolve(nil, err)
			return f
		}
		// e was retired from the pool while this publish chose it (the
		// client is not closing): the client's own node takes it, and
		// routes it from there.
		e = c.ep
		if err := e.window.acquire(ctx, e.quit, size); err != nil {
			f.resolve(nil, err)
			return f
		}
	}
	fl := &flight{f: f}
	fl.hinted.Store(hinted)
	if p.ProducerID == c.o.producerID && p.ProducerSeq == 0 {
		// Numbered only once it holds a window slot: the sequences in
		// flight then stay within the publish window, which the broker's
		// deduplication window covers, however long acquire waited. The
		// number enters the publish's ordering lane (order.go).
		c.lanes.number(c, p, fl)
	}
	c.rt.send(ctx, e, p, fl, size, 0)
	return f
}

// PublishText publishes text with content type "text/plain; charset=utf-8".
func (c *Client) PublishText(ctx context.Context, topic, text string, opts ...PublishOption) (PublishResult, error) {
	opts = append([]PublishOption{WithContentType("text/plain; charset=utf-8")}, opts...)
	return c.Publish(ctx, topic, []byte(text), opts...)
}

// PublishJSON publishes v encoded as JSON with content type "application/json".
func (c *Client) PublishJSON(ctx context.Context, topic string, v any, opts ...PublishOption) (PublishResult, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return PublishResult{}, fmt.Errorf("sinew: encode JSON: %w", err)
	}
	opts = append([]PublishOption{WithContentType("application/json")}, opts...)
	return c.Publish(ctx, topic, b, opts...)
}

// PublishNoConfirm sends a message with NO_REPLY: the broker sends no confirm,
// so nothing says whether or when it became durable. It returns once the frame
// is queued for the socket. A failure the broker reports later is only logged.
// Close flushes queued frames before closing.
func (c *Client) PublishNoConfirm(ctx context.Context, topic string, body []byte, opts ...PublishOption) error {
	p := &protocol.Publish{Topic: topic, Partition: -1, Body: body}
	for _, o := range opts {
		o(p)
	}
	conn, err := c.ep.acquire(ctx, false)
	if err != nil {
		return err
	}
	frame := protocol.AppendFrame(nil, protocol.FlagNoReply, conn.newID(), p)
	if len(frame) > conn.frameMax {
		return fmt.Errorf("sinew: PUBLISH frame of %d bytes exceeds the broker's frame limit %d: %w",
			len(frame), conn.frameMax, &protocol.Error{Code: protocol.CodeMessageTooLarge})
	}
	select {
	case conn.out <- frame:
		return nil
	case <-conn.done:
		return fmt.Errorf("%w: %w", ErrConnectionLost, conn.closeErr())
	case <-ctx.Done():
		return ctx.Err()
	}
}
