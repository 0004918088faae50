// Command graceful-shutdown is a worker that stops cleanly. On SIGINT or
// SIGTERM it stops taking messages, lets the messages already in hand finish
// and settle (bounded by a timeout), unsubscribes so the broker hands anything
// unsettled to other consumers at once, and closes the client, which waits for
// pending settles and confirms.
package main

import (
	"context"
	"errors"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/sinewmq/sinew"
)

const (
	workers         = 4
	shutdownTimeout = 10 * time.Second
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
	// stopCtx ends on a signal: no new messages are taken after that.
	stopCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// workCtx outlives the signal so in-hand messages can still be settled.
	workCtx, cancelWork := context.WithCancel(context.Background())
	defer cancelWork()

	c, err := sinew.Dial(stopCtx, addr, sinew.WithClientName("example-graceful"))
	if err != nil {
		return err
	}
	defer c.Close() // waits (bounded) for pending settles and confirms

	sub, err := c.Subscribe(stopCtx, "jobs", sinew.WithPrefetch(workers))
	if err != nil {
		return err
	}

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stopCtx.Done():
					return
				case m, ok := <-sub.Messages():
					if !ok {
						return
					}
					process(workCtx, m)
				}
			}
		})
	}

	<-stopCtx.Done()
	log.Print("shutting down: finishing messages in hand")
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(shutdownTimeout):
		log.Print("shutdown timeout: abandoning work in hand (it will be redelivered)")
		cancelWork()
		<-done
	}
	uctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := sub.Unsubscribe(uctx); err != nil && !errors.Is(err, sinew.ErrClientClosed) {
		log.Printf("unsubscribe: %v", err)
	}
	if err := sub.Err(); err != nil && !errors.Is(err, sinew.ErrUnsubscribed) {
		log.Printf("subscription had ended: %v", err)
	}
	return nil
}

func process(ctx context.Context, m *sinew.Message) {
	select {
	case <-time.After(200 * time.Millisecond): // the job
	case <-ctx.Done():
		return // abandoned: the lease expires and the broker redelivers
	}
	if err := m.Complete(ctx); err != nil {
		log.Printf("complete %d/%d: %v", m.Partition, m.Offset, err)
	}
}
