package e2e_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/protocol"
	"github.com/sinewmq/sinew/test/chaos/harness"
)

// freeAddr returns a loopback address no one listens on now, so that a
// restarted broker can come back at the address its clients know (outside
// the ephemeral port range: harness.FreeAddr).
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// signalChild ends c with sig and waits for the process to exit.
func signalChild(t *testing.T, c *child, sig os.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(safetyTimeout):
		t.Fatalf("sinew serve did not exit after %v:\n%s", sig, c.log())
	}
	c.cmd.Wait()
}

// waitLog waits until c's log has a line containing every one of parts.
func waitLog(t *testing.T, c *child, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(safetyTimeout)
	for {
		for _, line := range strings.Split(c.log(), "\n") {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(line, p)
			}
			if ok {
				return line
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q:\n%s", parts, c.log())
		}
		time.Sleep(20 * time.Millisecond) // polling a child's log; no condition to wait on
	}
}

func fastReconnect() sinew.Option {
	return sinew.WithReconnect(sinew.ReconnectPolicy{BaseDelay: 50 * time.Millisecond, MaxDelay: 250 * time.Millisecond})
}

// TestRestartKeepsConsumerLease: a consumer holds a delivery when the broker
// restarts (SIGTERM, and separately kill -9). After the restart the SDK
// resumes its session (outcome resumed, counted as after a restart), its
// ACK of the delivery is accepted, and another consumer of the queue,
// connected across the restart, never receives that message.
func TestRestartKeepsConsumerLease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	for _, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) { restartKeepsLease(t, bin, sig) })
	}
}

func restartKeepsLease(t *testing.T, bin string, sig os.Signal) {
	dir := t.TempDir()
	addr := freeAddr(t)
	// The consumer holds its delivery across the stop, so a drain runs to
	// its deadline: keep that short.
	srv := startChildArgs(t, bin, dir, "--listen", addr, "--runtime-seed-connection-drain-timeout-ms", "500")
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
	defer cancel()

	owner, err := sinew.Dial(ctx, addr, fastReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	sub, err := owner.Subscribe(ctx, "restart", sinew.WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.PublishText(ctx, "restart", "held"); err != nil {
		t.Fatal(err)
	}
	var m *sinew.Message
	select {
	case m = <-sub.Messages():
	case <-ctx.Done():
		t.Fatal("no delivery before the restart")
	}
	// The other consumer joins once the owner holds the message, so the
	// message can only reach it through a release.
	other, err := sinew.Dial(ctx, addr, fastReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	osub, err := other.Subscribe(ctx, "restart", sinew.WithPrefetch(10))
	if err != nil {
		t.Fatal(err)
	}

	signalChild(t, srv, sig)
	srv2 := startChildArgs(t, bin, dir, "--listen", addr)
	waitLog(t, srv2, "restart window started", "leases_reclaimed=1")

	if err := m.Complete(ctx); err != nil {
		t.Fatalf("ack after the restart: %v\n%s", err, srv2.log())
	}
	waitLog(t, srv2, "session resumed after restart")
	// Hand the queue to the other consumer alone, then send a sentinel: a
	// copy of "held" released to the queue would reach it first.
	if err := sub.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.PublishText(ctx, "restart", "sentinel"); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-osub.Messages():
		if got.Text() != "sentinel" {
			t.Fatalf("the other consumer received %q (attempt %d), want only the sentinel", got.Text(), got.Attempt)
		}
		if err := got.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatalf("the other consumer got nothing:\n%s", srv2.log())
	}
	signalChild(t, srv2, syscall.SIGTERM)
}

// TestRestartOwnerNeverReturns: a consumer holds a delivery when the broker
// is killed and never comes back. After the restart its lease is kept for
// the restart window, then released, and another consumer receives the
// message (attempt 2, the release not counted as a failure) well before
// the lease itself would have expired.
func TestRestartOwnerNeverReturns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	const windowMs = 1500
	srv := startChildArgs(t, bin, dir, "--listen", addr, "--runtime-seed-connection-restart-grace-ms", fmt.Sprint(windowMs))

	gone := dial(t, srv.addr)
	gone.subscribe(&protocol.Subscribe{Topic: "orphan", Partition: -1, Prefetch: 1})
	p := dial(t, srv.addr)
	p.publish(&protocol.Publish{Topic: "orphan", Partition: -1, Body: []byte("orphaned")})
	if d := gone.next(); string(d.Body) != "orphaned" || d.Attempt != 1 {
		t.Fatalf("first delivery %q attempt %d", d.Body, d.Attempt)
	}
	start := time.Now()
	signalChild(t, srv, syscall.SIGKILL)
	srv2 := startChildArgs(t, bin, dir, "--listen", addr)
	waitLog(t, srv2, "restart window started", "leases_reclaimed=1")

	d := dial(t, srv2.addr)
	d.subscribe(&protocol.Subscribe{Topic: "orphan", Partition: -1, Prefetch: 1})
	m := d.next()
	if string(m.Body) != "orphaned" || m.Attempt != 2 {
		t.Fatalf("after the window: %q attempt %d, want orphaned at attempt 2", m.Body, m.Attempt)
	}
	// The lease (30 s by default) had not expired: the window released it.
	if el := time.Since(start); el >= 30*time.Second {
		t.Fatalf("redelivered after %v: by lease expiry, not by the window", el)
	}
	waitLog(t, srv2, "restart window ended", "leases_released=1")
	if codes := d.settle(protocol.OpAck, 0, m.Tag); codes[0] != protocol.CodeOK {
		t.Fatalf("ack: %v", codes)
	}
	signalChild(t, srv2, syscall.SIGTERM)
}
