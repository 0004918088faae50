package sinew

import (
	"errors"
	"testing"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/server"
)

// TestRealPermissionsPerTopicPrefix: against the real broker, a user who may
// publish to and consume from "orders.*" but manage nothing gets
// ErrPermissionDenied for every request outside that, request by request;
// the connection, its session and its subscription carry on through the
// denials. A static token (every permission) may do what the user may not.
func TestRealPermissionsPerTopicPrefix(t *testing.T) {
	rb := startRealBroker(t, func(c *server.Config) { c.AuthTokens = []string{"machine-token"} })
	perms := auth.Permissions{Publish: []string{"orders.*"}, Consume: []string{"orders.*", "audit"}}
	if err := rb.Broker.Users().Add("alice", "correct horse", perms); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	alice := dialT(t, rb.Addr, WithUser("alice", "correct horse"))

	// Allowed: publish and consume under the prefix.
	if _, err := alice.PublishText(ctx, "orders.eu", "one"); err != nil {
		t.Fatalf("publish orders.eu: %v", err)
	}
	sub, err := alice.Subscribe(ctx, "orders.eu")
	if err != nil {
		t.Fatalf("subscribe orders.eu: %v", err)
	}
	if m := recv(t, sub); string(m.Body) != "one" {
		t.Fatalf("got %q", m.Body)
	}

	denied := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrPermissionDenied) || IsRetryable(err) {
			t.Fatalf("%s = %v, want a non-retryable ErrPermissionDenied", what, err)
		}
	}
	// Publish outside the prefix, and on the prefix's own stem ("orders"
	// does not match "orders.*").
	_, err = alice.PublishText(ctx, "payments", "x")
	denied("publish payments", err)
	_, err = alice.PublishText(ctx, "orders", "x")
	denied("publish orders", err)
	// Consume: allowed exactly on "audit", nowhere else.
	_, err = alice.Subscribe(ctx, "payments")
	denied("subscribe payments", err)
	_, err = alice.PublishText(ctx, "audit", "x")
	denied("publish audit (consume only)", err)
	// Manage: nothing, not even under the prefix she may publish to.
	_, err = alice.DeclareQueue(ctx, "orders.us", QueueConfig{})
	denied("declare orders.us", err)
	_, err = alice.PurgeQueue(ctx, "orders.eu", "")
	denied("purge orders.eu", err)
	denied("delete orders.eu", alice.DeleteQueue(ctx, "orders.eu", ""))

	// The connection carries on: the same client publishes, and the
	// subscription opened before the denials still delivers.
	if _, err := alice.PublishText(ctx, "orders.eu", "two"); err != nil {
		t.Fatalf("publish after denials: %v", err)
	}
	if m := recv(t, sub); string(m.Body) != "two" {
		t.Fatalf("after denials got %q", m.Body)
	}
	if err := alice.Err(); err != nil {
		t.Fatalf("client failed: %v", err)
	}
	audit, err := alice.Subscribe(ctx, "audit")
	if err != nil {
		t.Fatalf("subscribe audit: %v", err)
	}

	// A token principal holds every permission; what it publishes to
	// "audit" reaches alice, who may consume exactly that topic.
	machine := dialT(t, rb.Addr, WithCredentials("machine-token"))
	if _, err := machine.PublishText(ctx, "audit", "seen"); err != nil {
		t.Fatalf("token publish audit: %v", err)
	}
	if m := recv(t, audit); string(m.Body) != "seen" {
		t.Fatalf("audit got %q", m.Body)
	}
	if _, err := machine.PublishText(ctx, "payments", "x"); err != nil {
		t.Fatalf("token publish: %v", err)
	}
	if _, err := machine.DeclareQueue(ctx, "orders.us", QueueConfig{}); err != nil {
		t.Fatalf("token declare: %v", err)
	}
	if n, err := machine.PurgeQueue(ctx, "payments", ""); err != nil || n != 1 {
		t.Fatalf("token purge = %d, %v", n, err)
	}

	st := rb.Server.Stats()
	if st.PermissionDenials != 7 {
		t.Fatalf("PermissionDenials = %d, want 7", st.PermissionDenials)
	}
	if st.FatalErrors != 0 {
		t.Fatalf("FatalErrors = %d: a denial closed a connection", st.FatalErrors)
	}
}
