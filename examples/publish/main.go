// Command publish publishes messages to a Sinew queue: first one at a time,
// each waiting for the broker's durable confirm, then a pipelined batch.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/sinewmq/sinew"
)

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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := sinew.Dial(ctx, addr, sinew.WithClientName("example-publish"))
	if err != nil {
		return err
	}
	defer c.Close()

	// Declaring is optional (queues are created on first use); it lets us pick
	// settings: four partitions, three retries, then the queue "orders.dead".
	// The worker example and the TypeScript README declare "orders" the same
	// way, so they run against one broker in any order: a different partition
	// count would be refused with conflict.
	if _, err := c.DeclareQueue(ctx, "orders", sinew.QueueConfig{
		Partitions: 4, MaxRetries: 3, DeadLetter: sinew.DeadLetterQueue, DeadLetterTopic: "orders.dead",
	}); err != nil {
		return err
	}

	// One at a time: Publish returns once the message is durable.
	for i := 1; i <= 3; i++ {
		res, err := c.PublishJSON(ctx, "orders", map[string]any{"order": i, "amount": 10 * i},
			sinew.WithKey(fmt.Appendf(nil, "customer-%d", i%2)),
			sinew.WithHeader("source", "example"))
		if err != nil {
			return err
		}
		fmt.Printf("order %d -> partition %d offset %d\n", i, res.Partition, res.Offset)
	}

	// Pipelined: many publishes in flight, confirms collected afterwards. The
	// Client stamps each with its producer id and a sequence, so it resends
	// them itself if the connection breaks before the confirm, and the
	// broker stores each one once.
	futures := make([]*sinew.PublishFuture, 100)
	for i := range futures {
		futures[i] = c.PublishAsync(ctx, "orders", fmt.Appendf(nil, "bulk %d", i))
	}
	for i, f := range futures {
		if _, err := f.Wait(ctx); err != nil {
			return fmt.Errorf("bulk %d: %w", i, err)
		}
	}
	fmt.Printf("%d pipelined messages confirmed\n", len(futures))

	// A reminder delivered in a minute.
	if _, err := c.PublishText(ctx, "reminders", "call back", sinew.WithDelay(time.Minute)); err != nil {
		return err
	}
	return nil
}
