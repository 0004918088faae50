package sinew

import (
	"errors"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/testkit"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// PurgeQueue and DeleteQueue against the real in-process broker.
func TestRealPurgeAndDeleteQueue(t *testing.T) {
	rb := startRealBroker(t, nil)
	c := dialT(t, rb.Addr)
	ctx := testCtx(t)
	if _, err := c.DeclareQueue(ctx, "lifecycle", QueueConfig{Group: "g", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		if _, err := c.Publish(ctx, "lifecycle", []byte("x"), WithGroup("g")); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "lifecycle", WithSubscribeGroup("g"), WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	held := recv(t, sub)

	n, err := c.PurgeQueue(ctx, "lifecycle", "g")
	if err != nil || n != 5 {
		t.Fatalf("PurgeQueue = %d, %v; want 5 (one is held)", n, err)
	}
	if err := held.Complete(ctx); err != nil {
		t.Fatalf("Complete of a message held through the purge: %v", err)
	}
	if n, err := c.PurgeQueue(ctx, "lifecycle", "g"); err != nil || n != 0 {
		t.Fatalf("second PurgeQueue = %d, %v", n, err)
	}

	if err := c.DeleteQueue(ctx, "lifecycle", "g"); err != nil {
		t.Fatalf("DeleteQueue: %v", err)
	}
	var be *BrokerError
	if err := waitDone(t, sub); !errors.As(err, &be) || be.Code != protocol.CodeNotFound || !strings.Contains(be.Message, "deleted") {
		t.Fatalf("subscription ended with %v, want not_found: queue deleted", err)
	}
	if err := c.DeleteQueue(ctx, "lifecycle", "g"); !errors.As(err, &be) || be.Code != protocol.CodeNotFound {
		t.Fatalf("second DeleteQueue: %v, want not_found", err)
	}
	if _, err := c.PurgeQueue(ctx, "lifecycle", "g"); !errors.As(err, &be) || be.Code != protocol.CodeNotFound {
		t.Fatalf("PurgeQueue of a deleted queue: %v, want not_found", err)
	}
	// The name is free again: first use creates a new, empty queue.
	info, err := c.DeclareQueue(ctx, "lifecycle", QueueConfig{Group: "g"})
	if err != nil || !info.Created || info.Partitions != 1 {
		t.Fatalf("declare after delete: %+v %v", info, err)
	}
}

// A 255-byte topic, whose escaped on-disk name would be three times the
// file system's limit, works end to end.
func TestRealLongTopicRoundTrip(t *testing.T) {
	rb := startRealBroker(t, nil)
	c := dialT(t, rb.Addr)
	ctx := testCtx(t)
	topic := strings.Repeat("ß", 127) + "."
	sub, err := c.Subscribe(ctx, topic, WithPrefetch(1))
	if err != nil {
		t.Fatalf("subscribe to a 255-byte topic: %v", err)
	}
	if _, err := c.Publish(ctx, topic, []byte("long")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, sub); m.Text() != "long" {
		t.Fatalf("got %q", m.Text())
	}
	if err := c.DeleteQueue(ctx, topic, ""); err != nil {
		t.Fatal(err)
	}
}

// A partition stopped by an I/O error: Subscribe fails at once with a
// retryable unavailable error naming the partition and not the server's
// paths, and the subscription that was attached ends with the same code.
func TestRealSubscribeToFailedPartition(t *testing.T) {
	fs := vfs.NewMem()
	rb := testkit.StartBroker(t, testkit.WithFS(fs), testkit.WithFailingDisk())
	c := dialT(t, rb.Addr)
	ctx := testCtx(t)
	if _, err := c.DeclareQueue(ctx, "fragile", QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	before, err := c.Subscribe(ctx, "fragile")
	if err != nil {
		t.Fatal(err)
	}
	fs.SetSyncError(errors.New("input/output error on /data/queues"))
	_, err = c.Publish(ctx, "fragile", []byte("x"))
	fs.SetSyncError(nil)
	var be *BrokerError
	if !errors.As(err, &be) || be.Code != protocol.CodeUnavailable {
		t.Fatalf("publish with a failing fsync: %v", err)
	}
	if err := waitDone(t, before); !errors.As(err, &be) || be.Code != protocol.CodeUnavailable ||
		!strings.Contains(be.Message, "partition 0") || strings.Contains(be.Message, "/data") {
		t.Fatalf("attached subscription ended with %v", err)
	}
	_, err = c.Subscribe(ctx, "fragile", WithSubscribePartition(0))
	if !errors.As(err, &be) || be.Code != protocol.CodeUnavailable || !IsRetryable(err) ||
		!strings.Contains(be.Message, "failed") || strings.Contains(be.Message, "/data") {
		t.Fatalf("subscribe to the failed partition: %v", err)
	}
}
