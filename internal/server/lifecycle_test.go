package server

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/internal/session/bridge"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// startReal serves a real broker on an in-memory file system.
func startReal(t *testing.T, bcfg broker.Config, mod func(*Config)) *fixture {
	t.Helper()
	bcfg.DataDir, bcfg.FS = "/data", vfs.NewMem()
	b, err := broker.Open(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after the server's shutdown.
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("broker close: %v", err)
		}
	})
	return start(t, func(c *Config) {
		c.Backend = bridge.New(b)
		if mod != nil {
			mod(c)
		}
	})
}

func expectErr(t *testing.T, c *client, id uint64, code protocol.Code) *protocol.ErrorBody {
	t.Helper()
	h, e := expect[*protocol.ErrorBody](c)
	if h.RequestID != id || e.Code != code || e.Fatal {
		t.Fatalf("error %+v for request %d, want %v for %d", e, h.RequestID, code, id)
	}
	return e
}

// PURGE_QUEUE and DELETE_QUEUE over the wire, against the real broker.
func TestDeleteAndPurgeQueue(t *testing.T) {
	fx := startReal(t, broker.Config{}, nil)
	c := fx.dial()
	c.hello(protocol.Hello{})
	for _, body := range []string{"a", "b", "c"} {
		c.publish("jobs", body)
	}
	ok := c.subscribe(protocol.Subscribe{Topic: "jobs", Partition: -1, Prefetch: 1})
	_, d := expect[*protocol.Deliver](c)
	if string(d.Body) != "a" {
		t.Fatalf("delivered %q", d.Body)
	}

	id := c.send(0, &protocol.PurgeQueue{Topic: "jobs"})
	h, p := expect[*protocol.PurgeOK](c)
	if h.RequestID != id || p.Purged != 2 {
		t.Fatalf("PURGE_OK %+v for %d, want 2 for %d", p, h.RequestID, id)
	}
	// The delivery held through the purge still settles.
	if codes := c.settle(protocol.OpAck, d.Tag); codes[0] != protocol.CodeOK {
		t.Fatalf("ack after purge: %v", codes)
	}

	id = c.send(0, &protocol.DeleteQueue{Topic: "jobs"})
	got := c.readN(2)
	if len(got[protocol.OpOK]) != 1 || len(got[protocol.OpSubClosed]) != 1 {
		t.Fatalf("frames after DELETE_QUEUE: %v", got)
	}
	sc := got[protocol.OpSubClosed][0].(*protocol.SubClosed)
	if sc.SubID != ok.SubID || sc.Reason != protocol.SubClosedQueueDeleted {
		t.Fatalf("SUB_CLOSED %+v", sc)
	}
	expectErr(t, c, c.send(0, &protocol.DeleteQueue{Topic: "jobs"}), protocol.CodeNotFound)
	expectErr(t, c, c.send(0, &protocol.PurgeQueue{Topic: "jobs"}), protocol.CodeNotFound)
	expectErr(t, c, c.send(0, &protocol.DeleteQueue{Topic: ""}), protocol.CodeBadRequest)
	c.ping()
}

// Creation beyond the budget is limit_exceeded naming the limit; a topic
// of 255 bytes that escapes far beyond the file-name limit is stored.
func TestCreationBudgetAndLongTopicOverTheWire(t *testing.T) {
	fx := startReal(t, broker.Config{QueuesMax: 1}, nil)
	c := fx.dial()
	c.hello(protocol.Hello{})
	long := strings.Repeat("é", 127) + "!"
	c.publish(long, "x")
	id := c.send(0, &protocol.Publish{Topic: "second", Partition: -1, Body: []byte("x")})
	e := expectErr(t, c, id, protocol.CodeLimitExceeded)
	if !strings.Contains(e.Message, "limits.queues_max") {
		t.Fatalf("limit error %q does not name the limit", e.Message)
	}
	id = c.send(0, &protocol.Subscribe{Topic: "second", Partition: -1})
	expectErr(t, c, id, protocol.CodeLimitExceeded)
}

// failingBackend fails every declare with an error that names a path.
type failingBackend struct{ session.Backend }

func (failingBackend) Declare(context.Context, *protocol.DeclareQueue) (protocol.DeclareOK, error) {
	return protocol.DeclareOK{}, errors.New("open /var/lib/sinew/queues/=x/meta: input/output error")
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// An error without a protocol code reaches the peer as internal with a
// fixed message, and the log gets the cause with the request's context.
func TestUncodedErrorsAreLoggedNotSent(t *testing.T) {
	var logs syncBuffer
	fx := start(t, func(c *Config) {
		c.Backend = failingBackend{c.Backend}
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	c := fx.dial()
	c.hello(protocol.Hello{})
	e := expectErr(t, c, c.send(0, &protocol.DeclareQueue{Topic: "x", MaxRetries: -1}), protocol.CodeInternal)
	if strings.Contains(e.Message, "/var/lib") || strings.Contains(e.Message, "input/output") {
		t.Fatalf("ERROR leaks the cause: %q", e.Message)
	}
	out := logs.String()
	for _, want := range []string{"op=DECLARE_QUEUE", "topic=x", "/var/lib/sinew/queues"} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %q:\n%s", want, out)
		}
	}
}

// heldDeclares is a backend whose declares of topic "slow" wait until
// release is closed (a cluster's controller and elections).
type heldDeclares struct {
	session.Backend
	started chan struct{}
	release chan struct{}
}

func (h heldDeclares) Declare(ctx context.Context, d *protocol.DeclareQueue) (protocol.DeclareOK, error) {
	if d.Topic == "slow" {
		close(h.started)
		select {
		case <-h.release:
		case <-ctx.Done():
			return protocol.DeclareOK{}, ctx.Err()
		}
	}
	return h.Backend.Declare(ctx, d)
}

// A declare that takes long does not hold up the connection's requests
// about other queues; one about the same topic, sent after it, is handled
// after it, in order.
func TestSlowDeclareHoldsUpOnlyItsTopic(t *testing.T) {
	h := heldDeclares{started: make(chan struct{}), release: make(chan struct{})}
	fx := start(t, func(c *Config) {
		h.Backend = c.Backend
		c.Backend = h
	})
	c := fx.dial()
	c.hello(protocol.Hello{})
	slow := c.send(0, &protocol.DeclareQueue{Topic: "slow", Partitions: 1, MaxRetries: -1})
	<-h.started
	// Another queue: answered while the declare waits.
	other := c.send(0, &protocol.Publish{Topic: "other", Partition: -1, Body: []byte("x")})
	hdr, _ := expect[*protocol.PublishOK](c)
	if hdr.RequestID != other {
		t.Fatalf("answer to request %d, want the publish %d", hdr.RequestID, other)
	}
	// The same topic: waits for the declare, then is answered after it.
	same := c.send(0, &protocol.Publish{Topic: "slow", Partition: -1, Body: []byte("y")})
	close(h.release)
	hdr, _ = expect[*protocol.DeclareOK](c)
	if hdr.RequestID != slow {
		t.Fatalf("answer to request %d, want the declare %d", hdr.RequestID, slow)
	}
	hdr, _ = expect[*protocol.PublishOK](c)
	if hdr.RequestID != same {
		t.Fatalf("answer to request %d, want the publish %d", hdr.RequestID, same)
	}
}
