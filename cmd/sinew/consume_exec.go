package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/sinewmq/sinew"
)

// consumeExec is consume --exec: a command run per message, settled by its
// exit status, the lease extended while it runs (--extend-every).
type consumeExec struct {
	cmd         string
	extendEvery time.Duration // 0: never
	stdout      io.Writer
	stderr      io.Writer
	addr        string
	// settleTimeout bounds one settle and one extension.
	settleTimeout time.Duration
}

// consumeExecSettleTimeout bounds each settle and extension consume --exec
// sends.
const consumeExecSettleTimeout = 30 * time.Second

// run handles messages until count is reached (0: no limit), nothing
// arrives for idleExit (0: never), ctx ends or the subscription does.
func (x *consumeExec) run(ctx context.Context, sub *sinew.Subscription, count int, idleExit time.Duration) error {
	if x.settleTimeout == 0 {
		x.settleTimeout = consumeExecSettleTimeout
	}
	var idle <-chan time.Time
	var idleTimer *time.Timer
	if idleExit > 0 {
		idleTimer = time.NewTimer(idleExit)
		defer idleTimer.Stop()
		idle = idleTimer.C
	}
	for n := 0; count == 0 || n < count; n++ {
		var m *sinew.Message
		select {
		case m = <-sub.Messages():
		case <-idle:
			return x.finish(sub)
		case <-ctx.Done():
			// Interrupted: the message under way, if any, was not
			// settled; the unsubscribe hands it back.
			_ = x.finish(sub)
			return nil
		}
		if m == nil {
			err := sub.Err()
			if errors.Is(err, sinew.ErrClientClosed) || errors.Is(err, sinew.ErrUnsubscribed) {
				return nil
			}
			return fmt.Errorf("subscription ended: %w", describeClientErr(x.addr, err))
		}
		if err := x.handle(ctx, m); err != nil {
			if ctx.Err() != nil {
				_ = x.finish(sub)
				return nil
			}
			return err
		}
		if idleTimer != nil {
			idleTimer.Reset(idleExit)
		}
	}
	return x.finish(sub)
}

func (x *consumeExec) finish(sub *sinew.Subscription) error {
	ctx, cancel := context.WithTimeout(context.Background(), consumeUnsubscribeTimeout)
	defer cancel()
	_ = sub.Unsubscribe(ctx)
	return nil
}

// handle runs the command for m, extending m's lease meanwhile, and
// settles m by its exit status. A stale settle (the lease ended: the
// message is delivered again) is reported and the run carries on; other
// settle errors end it.
func (x *consumeExec) handle(ctx context.Context, m *sinew.Message) error {
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", x.cmd)
	cmd.Stdin = bytes.NewReader(m.Body)
	cmd.Stdout, cmd.Stderr = x.stdout, x.stderr
	cmd.Env = append(os.Environ(),
		"SINEW_TOPIC="+m.Topic, "SINEW_GROUP="+m.Group,
		"SINEW_PARTITION="+strconv.FormatUint(uint64(m.Partition), 10),
		"SINEW_OFFSET="+strconv.FormatUint(m.Offset, 10),
		"SINEW_ATTEMPT="+strconv.FormatUint(uint64(m.Attempt), 10))
	stop := x.extendWhile(m)
	runErr := cmd.Run()
	stop()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	sctx, cancel := context.WithTimeout(ctx, x.settleTimeout)
	defer cancel()
	var err error
	what := "ack"
	if runErr == nil {
		err = m.Complete(sctx)
	} else {
		what = "retry"
		fmt.Fprintf(x.stderr, "sinew consume: partition %d offset %d: command failed (%v); retrying the message\n", m.Partition, m.Offset, runErr)
		err = m.Retry(sctx)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sinew.ErrStaleDelivery):
		fmt.Fprintf(x.stderr, "sinew consume: warning: %s of partition %d offset %d was stale: its lease ended while the command ran; the message will be delivered again (see --extend-every)\n",
			what, m.Partition, m.Offset)
		return nil
	}
	return fmt.Errorf("%s of partition %d offset %d: %w", what, m.Partition, m.Offset, describeClientErr(x.addr, err))
}

// extendWhile extends m's lease every x.extendEvery, to three times that
// from now, until the returned stop is called; stop waits for an extension
// under way. Without --extend-every it does nothing. A failed extension is
// reported; once the lease is gone (stale) it stops trying.
func (x *consumeExec) extendWhile(m *sinew.Message) (stop func()) {
	if x.extendEvery <= 0 {
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(x.extendEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), min(x.settleTimeout, 3*x.extendEvery))
			err := m.Extend(ctx, 3*x.extendEvery)
			cancel()
			switch {
			case err == nil:
			case errors.Is(err, sinew.ErrStaleDelivery):
				fmt.Fprintf(x.stderr, "sinew consume: warning: partition %d offset %d: the lease ended before it could be extended; the message will be delivered again\n", m.Partition, m.Offset)
				return
			default:
				fmt.Fprintf(x.stderr, "sinew consume: warning: partition %d offset %d: lease extension failed: %v\n", m.Partition, m.Offset, describeClientErr(x.addr, err))
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}
