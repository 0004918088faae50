package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sinewmq/sinew"
)

func init() {
	commands["consume"] = command{
		summary: "print messages from a queue, acking each after printing",
		run:     runConsume,
	}
}

// consumePrefetchMax bounds --prefetch: the largest limits.prefetch_max.
const consumePrefetchMax = 1 << 20

type consumeJSON struct {
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
	Attempt   uint32 `json:"attempt"`
	Body      string `json:"body"`
}

func runConsume(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("consume", stderr)
	cf := addClientFlags(fs)
	topic := fs.String("topic", "", "queue topic (required)")
	group := fs.String("group", "", "queue group")
	count := fs.Int("count", 0, "exit after this many messages (0 = no limit)")
	prefetch := fs.Int("prefetch", 64, "unsettled deliveries at once, 0 to 1048576 (0 = the broker's limits.prefetch_default; the broker clamps to its limits.prefetch_max)")
	autoAck := fs.Bool("auto-ack", false, "let the broker settle on delivery (a crash loses messages)")
	idleExit := fs.Duration("idle-exit", 0, "exit after this long with nothing arriving (0 = never)")
	asJSON := fs.Bool("json", false, `print {"partition":p,"offset":o,"attempt":a,"body":"..."} per message`)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *topic == "":
		return fmt.Errorf("%w: --topic is required", errUsage)
	case *count < 0 || *idleExit < 0:
		return fmt.Errorf("%w: --count and --idle-exit must not be negative", errUsage)
	}
	// The wire carries a 32-bit prefetch; the bound is the largest
	// limits.prefetch_max a broker accepts.
	if err := checkRange("prefetch", int64(*prefetch), 0, consumePrefetchMax); err != nil {
		return err
	}

	c, err := cf.dial(ctx, "sinew-consume", stderr)
	if err != nil {
		return err
	}
	defer c.Close()
	opts := []sinew.SubscribeOption{sinew.WithPrefetch(*prefetch)}
	if *group != "" {
		opts = append(opts, sinew.WithSubscribeGroup(*group))
	}
	if *autoAck {
		opts = append(opts, sinew.WithAutoAck())
	}
	sub, err := c.Subscribe(ctx, *topic, opts...)
	if err != nil {
		return describeClientErr(*cf.addr, err)
	}

	out := bufio.NewWriter(stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	var idle <-chan time.Time
	var idleTimer *time.Timer
	if *idleExit > 0 {
		idleTimer = time.NewTimer(*idleExit)
		defer idleTimer.Stop()
		idle = idleTimer.C
	}
	for n := 0; *count == 0 || n < *count; n++ {
		var m *sinew.Message
		select {
		case m = <-sub.Messages():
		case <-idle:
			return finishConsume(sub, out)
		case <-ctx.Done():
			_ = finishConsume(sub, out)
			return nil // interrupted: a normal way to stop a consumer
		}
		if m == nil {
			err := sub.Err()
			if errors.Is(err, sinew.ErrClientClosed) || errors.Is(err, sinew.ErrUnsubscribed) {
				return out.Flush()
			}
			return fmt.Errorf("subscription ended: %w", describeClientErr(*cf.addr, err))
		}
		if *asJSON {
			err = enc.Encode(consumeJSON{Partition: m.Partition, Offset: m.Offset, Attempt: m.Attempt, Body: string(m.Body)})
		} else {
			_, err = fmt.Fprintf(out, "%s\n", m.Body)
		}
		if err == nil {
			err = out.Flush() // printed before acked
		}
		if err != nil {
			return err
		}
		if err := m.Complete(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ack of partition %d offset %d: %w", m.Partition, m.Offset, describeClientErr(*cf.addr, err))
		}
		if idleTimer != nil {
			idleTimer.Reset(*idleExit)
		}
	}
	return finishConsume(sub, out)
}

// consumeUnsubscribeTimeout bounds the unsubscribe on exit.
const consumeUnsubscribeTimeout = 5 * time.Second

func finishConsume(sub *sinew.Subscription, out *bufio.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), consumeUnsubscribeTimeout)
	defer cancel()
	_ = sub.Unsubscribe(ctx)
	return out.Flush()
}
