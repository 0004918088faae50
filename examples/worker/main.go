// Command worker consumes a Sinew queue. A message that fails transiently is
// retried after a growing delay; one that can never succeed is failed at once,
// and one that keeps failing is dead-lettered by the broker after the queue's
// max retries. A second subscription watches the dead-letter queue.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/sinewmq/sinew"
)

// errPermanent marks input that no retry can fix.
var errPermanent = errors.New("permanent failure")

// retryDelayMax caps the delay before a retry.
const retryDelayMax = time.Minute

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	addr := os.Getenv("SINEW_ADDR")
	if addr == "" {
		addr = "127.0.0.1:7654"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	c, err := sinew.Dial(ctx, addr, sinew.WithClientName("example-worker"))
	if err != nil {
		return err
	}
	defer c.Close()

	// Failed and exhausted messages go to the queue "orders.dead". The
	// declaration is the publish example's, so either may run first.
	if _, err := c.DeclareQueue(ctx, "orders", sinew.QueueConfig{
		Partitions: 4, MaxRetries: 3, DeadLetter: sinew.DeadLetterQueue, DeadLetterTopic: "orders.dead",
	}); err != nil {
		return err
	}
	dead, err := c.Subscribe(ctx, "orders.dead", sinew.WithPrefetch(16))
	if err != nil {
		return err
	}
	go func() {
		for m := range dead.Messages() {
			reason, _ := m.Header("sinew.reason")
			log.Printf("dead letter (%s): %s", reason, m.Body)
			_ = m.Complete(ctx)
		}
	}()

	sub, err := c.Subscribe(ctx, "orders", sinew.WithPrefetch(32))
	if err != nil {
		return err
	}
	for m, err := range sub.All(ctx) {
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted
			}
			return fmt.Errorf("subscription ended: %w", err)
		}
		switch err := handle(m); {
		case err == nil:
			err = m.Complete(ctx)
			if err != nil {
				log.Printf("complete %d/%d: %v", m.Partition, m.Offset, err)
			}
		case errors.Is(err, errPermanent):
			log.Printf("failing %d/%d: %v", m.Partition, m.Offset, err)
			_ = m.Fail(ctx)
		default:
			// Back off a little more on every attempt; the broker counts the
			// retries and dead-letters the message when they run out.
			d := min(time.Duration(1<<min(m.Attempt, 6))*time.Second, retryDelayMax)
			log.Printf("retrying %d/%d in %v: %v", m.Partition, m.Offset, d, err)
			_ = m.RetryAfter(ctx, d)
		}
	}
	return nil
}

// handle is the application's work.
func handle(m *sinew.Message) error {
	switch {
	case len(m.Body) == 0:
		return fmt.Errorf("%w: empty order", errPermanent)
	case m.Attempt < 2 && m.Offset%5 == 0:
		return errors.New("inventory service busy") // transient, for the demo
	}
	log.Printf("processed %d/%d: %s", m.Partition, m.Offset, m.Body)
	return nil
}
