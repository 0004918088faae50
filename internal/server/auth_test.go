package server

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// cheapHash keeps these tests fast; the parameters are recorded per hash, so
// the store verifies the same way with the defaults.
var cheapHash = auth.HashParams{TimeCost: 1, MemoryKiB: 64, Threads: 1}

func newUsers(t *testing.T, users ...string) *auth.Users {
	t.Helper()
	u, err := auth.OpenUsersParams(vfs.NewMem(), "/data/meta/users", cheapHash)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(users); i += 2 {
		if err := u.Add(users[i], users[i+1], auth.Permissions{Publish: []string{"*"}}); err != nil {
			t.Fatal(err)
		}
	}
	return u
}

// helloFails sends h and expects the fatal auth_failed and the close.
func (c *client) helloFails(h protocol.Hello) {
	c.t.Helper()
	h.ProtocolVersion = protocol.Version
	c.send(0, &h)
	c.expectFatal(protocol.CodeAuthFailed)
}

// TestAuthUsersAndTokens: a user with the right password and a static token
// get in; a wrong password, an unknown user, a wrong token and no
// credentials at all (users exist, so even loopback needs them) are refused
// with auth_failed, counted once each, while a bystander carries on.
func TestAuthUsersAndTokens(t *testing.T) {
	users := newUsers(t, "alice", "correct horse")
	fx := start(t, func(c *Config) {
		c.Users, c.AuthTokens, c.AuthFailureDelayMs = users, []string{"machine-token"}, -1
	})
	bystander := fx.dial()
	bystander.hello(protocol.Hello{User: "alice", Credentials: "correct horse"})
	bystander.publish("q", "before")
	fx.dial().hello(protocol.Hello{Credentials: "machine-token"})

	refused := []protocol.Hello{
		{User: "alice", Credentials: "wrong horse"},
		{User: "alice"},
		{User: "mallory", Credentials: "correct horse"},
		{User: "alice", Credentials: "machine-token"}, // a token is not alice's password
		{Credentials: "correct horse"},                // a password is not a token
		{Credentials: "nope"},
		{},
	}
	for _, h := range refused {
		fx.dial().helloFails(h)
	}
	bystander.publish("q", "after")
	if st := fx.srv.Stats(); st.AuthFailures != uint64(len(refused)) {
		t.Fatalf("AuthFailures = %d, want %d", st.AuthFailures, len(refused))
	}
}

// publicListener reports a non-loopback address for a loopback socket, so a
// test can exercise the rule for public listeners without a public
// interface.
type publicListener struct{ net.Listener }

func (publicListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4zero, Port: 7654} }

func serveOn(t *testing.T, srv *Server, ln net.Listener) *fixture {
	t.Helper()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("serve returned %v", err)
		}
	})
	inner := ln.(publicListener).Listener
	return &fixture{t: t, srv: srv, addr: inner.Addr().String()}
}

// TestAnonymousRule: without credentials, a loopback listener of a broker
// with no users and no tokens admits a client; a public listener does not,
// unless AllowAnonymous; and once a user exists, loopback needs credentials
// too.
func TestAnonymousRule(t *testing.T) {
	users := newUsers(t)
	lo := start(t, func(c *Config) { c.Users, c.AuthFailureDelayMs = users, -1 })
	lo.dial().hello(protocol.Hello{})

	for _, allow := range []bool{false, true} {
		srv, err := New(Config{Backend: lo.fake, OwnerID: "owner-test", Rand: &seq{}, Users: users,
			AllowAnonymous: allow, AuthFailureDelayMs: -1})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		pub := serveOn(t, srv, publicListener{ln})
		if allow {
			pub.dial().hello(protocol.Hello{})
		} else {
			pub.dial().helloFails(protocol.Hello{})
		}
	}

	// A user added at run time (as the admin API does) ends anonymous
	// access on loopback at once; the user gets in.
	if err := users.Add("bob", "password-b", auth.Permissions{}); err != nil {
		t.Fatal(err)
	}
	lo.dial().helloFails(protocol.Hello{})
	lo.dial().hello(protocol.Hello{User: "bob", Credentials: "password-b"})
}

// TestAuthFailureDelay: a refused HELLO is answered only after
// AuthFailureDelayMs, measured on synctest's fake clock; a good HELLO is
// answered at once.
func TestAuthFailureDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		users := newUsers(t, "alice", "correct horse")
		p := newPipeServer(t, func(c *Config) {
			c.Users, c.AuthFailureDelayMs, c.HandshakeTimeoutMs = users, 1000, 5000
		})
		good := p.dial()
		start := time.Now()
		good.hello(protocol.Hello{User: "alice", Credentials: "correct horse"})
		if d := time.Since(start); d != 0 {
			t.Fatalf("good HELLO answered after %v of fake time, want at once", d)
		}

		bad := p.dial()
		bad.send(0, &protocol.Hello{ProtocolVersion: protocol.Version, User: "alice", Credentials: "wrong"})
		var mu sync.Mutex
		var got *protocol.ErrorBody
		go func() {
			_, b, err := bad.tryRead()
			if err == nil {
				mu.Lock()
				got, _ = b.(*protocol.ErrorBody)
				mu.Unlock()
			}
		}()
		answered := func() bool { mu.Lock(); defer mu.Unlock(); return got != nil }
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		if answered() {
			t.Fatal("auth_failed sent before the delay")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if !answered() || got.Code != protocol.CodeAuthFailed || !got.Fatal {
			t.Fatalf("after the delay got %+v, want fatal auth_failed", got)
		}
		good.ping()
		p.shutdown()
	})
}

// TestAuthLogNeverHasCredential: the server's log (at debug level) names the
// refused user and the remote address but never a password or token, for
// refused and accepted logins alike.
func TestAuthLogNeverHasCredential(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{mu: &mu, w: &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	users := newUsers(t, "alice", "pw-alice-secret")
	fx := start(t, func(c *Config) {
		c.Users, c.AuthTokens, c.AuthFailureDelayMs, c.Logger = users, []string{"tok-machine-secret"}, -1, logger
	})
	secrets := []string{"pw-alice-secret", "tok-machine-secret", "pw-wrong-secret", "tok-wrong-secret"}
	fx.dial().hello(protocol.Hello{User: "alice", Credentials: "pw-alice-secret"})
	fx.dial().hello(protocol.Hello{Credentials: "tok-machine-secret"})
	fx.dial().helloFails(protocol.Hello{User: "alice", Credentials: "pw-wrong-secret"})
	fx.dial().helloFails(protocol.Hello{User: "mallory", Credentials: "tok-machine-secret"})
	fx.dial().helloFails(protocol.Hello{Credentials: "tok-wrong-secret"})
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("log contains credential %q:\n%s", s, out)
		}
	}
	var failures int
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, `"msg":"authentication failed"`) {
			failures++
			if !strings.Contains(line, `"remote":"127.0.0.1:`) {
				t.Errorf("failure record without the remote address: %s", line)
			}
		}
	}
	if failures != 3 || !strings.Contains(out, `"user":"mallory"`) {
		t.Fatalf("%d failure records, want 3 naming the user:\n%s", failures, out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
