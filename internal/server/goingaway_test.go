package server

import (
	"context"
	"testing"

	"github.com/sinewmq/sinew/internal/sessionstore"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// TestGoingAwayAnnouncesRestartGrace checks that GOING_AWAY's grace_ms is how
// long the session stays resumable once the broker is back: the restart
// grace when sessions are persisted for the next process, not the reconnect
// grace (a draining broker ends sessions at their disconnect), and 0 when
// nothing is persisted.
func TestGoingAwayAnnouncesRestartGrace(t *testing.T) {
	withStore := func(c *Config) {
		st, err := sessionstore.Open(sessionstore.Options{FS: vfs.NewMem(), Dir: "/data/sessions"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		c.SessionStore = st
	}
	cases := []struct {
		name string
		mod  func(*Config)
		want uint32
	}{
		{"no store", func(c *Config) { c.ReconnectGraceMs, c.RestartGraceMs = 5000, 30_000 }, 0},
		{"store", func(c *Config) { withStore(c); c.ReconnectGraceMs, c.RestartGraceMs = 5000, 30_000 }, 30_000},
		{"store, setting changed since startup", func(c *Config) {
			withStore(c)
			c.ReconnectGraceMs, c.RestartGraceMs = 5000, 30_000
			c.RestartGraceMsNext = func() int64 { return 45_000 }
		}, 45_000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := start(t, tc.mod)
			c := fx.dial()
			c.hello(protocol.Hello{})
			ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- fx.srv.Shutdown(ctx) }()
			_, away := expect[*protocol.GoingAway](c)
			if away.GraceMs != tc.want {
				t.Errorf("GOING_AWAY grace_ms %d, want %d", away.GraceMs, tc.want)
			}
			c.expectClosed()
			if err := <-done; err != nil {
				t.Fatalf("shutdown: %v", err)
			}
		})
	}
}

// TestGoingAwayRedirect checks GOING_AWAY's redirect: on a cluster node the
// address Config.Redirect names (a node that stays up), and empty on a
// single broker, even with a Redirect set.
func TestGoingAwayRedirect(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"cluster", func(c *Config) { c.Cluster, c.Redirect = true, func() string { return "127.0.0.1:7002" } }, "127.0.0.1:7002"},
		{"cluster, no node known", func(c *Config) { c.Cluster, c.Redirect = true, func() string { return "" } }, ""},
		{"single broker", func(c *Config) { c.Redirect = func() string { return "127.0.0.1:7002" } }, ""},
		{"single broker, no redirect", nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := start(t, tc.mod)
			c := fx.dial()
			c.hello(protocol.Hello{})
			ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- fx.srv.Shutdown(ctx) }()
			_, away := expect[*protocol.GoingAway](c)
			if away.Redirect != tc.want {
				t.Errorf("GOING_AWAY redirect %q, want %q", away.Redirect, tc.want)
			}
			c.expectClosed()
			if err := <-done; err != nil {
				t.Fatalf("shutdown: %v", err)
			}
		})
	}
}
