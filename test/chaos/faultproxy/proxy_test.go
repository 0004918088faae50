package faultproxy

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes every connection until closed.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return l.Addr().String()
}

func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo = %q, %v; want %q", buf, err, msg)
	}
}

func TestForwardAndDelay(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "hello")
	p.SetDelay(20 * time.Millisecond)
	roundTrip(t, c, "delayed but intact")
	p.SetDelay(0)
	roundTrip(t, c, "again")
	if s := p.Stats(); s.Accepted != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCutResetsAndNewConnectionsWork(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "before")
	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut closed %d connections, want 1", n)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after cut = %v, want a connection error", err)
	}
	roundTrip(t, dial(t, p.Addr()), "after")
}

func TestRefuse(t *testing.T) {
	p := startProxy(t, echoServer(t))
	p.Refuse(true)
	// The reset may reach the dialer during connect or on its first read.
	if c, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second); err == nil {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read on refused connection = %v, want a connection error", err)
		}
	}
	p.Refuse(false)
	roundTrip(t, dial(t, p.Addr()), "accepted again")
	if s := p.Stats(); s.Refused != 1 || s.Accepted != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestStallHoldsBytesUntilUnstall(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "warm")
	p.Stall()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	// While stalled nothing may come back; the deadline only bounds the check.
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 4)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read while stalled = %d, %v; want nothing", n, err)
	}
	p.Unstall()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after unstall = %q, %v", buf, err)
	}
}

func TestCloseWhileStalled(t *testing.T) {
	p, err := Start("127.0.0.1:0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	roundTrip(t, c, "x")
	p.Stall()
	if _, err := c.Write([]byte("stuck")); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCutEvery: a connection is reset once it has forwarded its byte budget,
// and the next connection gets a fresh one.
func TestCutEvery(t *testing.T) {
	p := startProxy(t, echoServer(t))
	p.CutEvery(1000)
	c := dial(t, p.Addr())
	if _, err := c.Write(make([]byte, 600)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // failsafe only
	n, err := io.Copy(io.Discard, c)
	if err == nil && n == 0 {
		t.Fatal("connection closed without forwarding anything")
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("connection was not cut after its budget")
	}
	if got := p.Stats().Cut; got != 1 {
		t.Fatalf("Stats().Cut = %d, want 1", got)
	}
	c2 := dial(t, p.Addr())
	if _, err := c2.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c2, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("second connection: %q, %v", buf, err)
	}
}
