package testkit

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes every connection until the listener closes.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go func() { _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string) (string, error) {
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func TestProxyForwardsCutsAndRefuses(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "hello"); err != nil || got != "hello" {
		t.Fatalf("echo = %q, %v", got, err)
	}
	p.CutAll()
	if _, err := roundTrip(c, "again"); err == nil {
		t.Fatal("connection survived CutAll")
	}

	p.SetRefuse(true)
	// The reset may reach the dial itself or the first exchange.
	if r, err := net.Dial("tcp", p.Addr()); err == nil {
		_, err = roundTrip(r, "x")
		_ = r.Close()
		if err == nil {
			t.Fatal("refused connection carried data")
		}
	}
	p.SetRefuse(false)
	ok, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close()
	if got, err := roundTrip(ok, "back"); err != nil || got != "back" {
		t.Fatalf("after refuse: %q, %v", got, err)
	}
	if p.Accepted() != 3 {
		t.Fatalf("Accepted = %d, want 3", p.Accepted())
	}
}

func TestProxyStallHoldsBytesUntilResumed(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.SetStalled(true)
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	// Nothing comes back while stalled: a short read deadline proves it
	// without asserting how long anything takes.
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	var ne net.Error
	if _, err := c.Read(make([]byte, 4)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read while stalled = %v, want a timeout", err)
	}
	_ = c.SetReadDeadline(time.Time{})
	p.SetStalled(false)
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after stall: %q, %v", buf, err)
	}
}

func TestClockFiresTimersInOrderAndRecordsWaits(t *testing.T) {
	clk := NewClock(time.Unix(100, 0))
	a := clk.After(2 * time.Second)
	b := clk.After(time.Second)
	select {
	case <-a:
		t.Fatal("fired before Advance")
	case <-b:
		t.Fatal("fired before Advance")
	default:
	}
	clk.Advance(time.Second)
	if got := <-b; !got.Equal(time.Unix(101, 0)) {
		t.Fatalf("b fired at %v", got)
	}
	select {
	case <-a:
		t.Fatal("a fired early")
	default:
	}
	clk.Advance(time.Second)
	<-a
	if w := clk.Waits(); len(w) != 2 || w[0] != 2*time.Second || w[1] != time.Second {
		t.Fatalf("Waits = %v", w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go clk.After(time.Minute)
	if w, err := clk.WaitForWaits(ctx, 3); err != nil || w[2] != time.Minute {
		t.Fatalf("WaitForWaits = %v, %v", w, err)
	}
	if p := clk.Pending(); len(p) != 1 || p[0] != time.Minute {
		t.Fatalf("Pending = %v", p)
	}
}
