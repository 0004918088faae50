package sinew

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

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
	// A token principal holds every permission: it creates the queues alice
	// uses, since creating one needs manage, which she does not hold.
	machine := dialT(t, rb.Addr, WithCredentials("machine-token"))
	for _, topic := range []string{"orders.eu", "audit"} {
		if _, err := machine.DeclareQueue(ctx, topic, QueueConfig{}); err != nil {
			t.Fatalf("token declare %s: %v", topic, err)
		}
	}
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

	// What the token publishes to "audit" reaches alice, who may consume
	// exactly that topic.
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

// TestRealCreatingAQueueNeedsManage: against the real broker, a PUBLISH or
// SUBSCRIBE naming a queue that does not exist creates it only for a
// principal that may manage the topic. A user who may publish and consume
// everywhere but manage nothing is refused permission_denied, saying why,
// and no queue appears, however many names it tries, so it cannot use up
// the broker's queue budget; to a queue that exists it publishes and
// consumes as before. A user with manage on the topic, a static token and
// an anonymous peer create on first use as they always did.
func TestRealCreatingAQueueNeedsManage(t *testing.T) {
	rb := startRealBroker(t, func(c *server.Config) {
		c.AuthTokens = []string{"machine-token"}
		c.AllowAnonymous = true
	})
	users := rb.Broker.Users()
	if err := users.Add("pub", "pub password", auth.Permissions{Publish: []string{"*"}, Consume: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	if err := users.Add("owner", "owner password", auth.Permissions{Publish: []string{"*"}, Consume: []string{"*"}, Manage: []string{"mine.*"}}); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	queues := func() int { return len(rb.Broker.Stats().Queues) }
	pub := dialT(t, rb.Addr, WithUser("pub", "pub password"))

	denied := func(what string, err error, want string) {
		t.Helper()
		if !errors.Is(err, ErrPermissionDenied) || IsRetryable(err) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s = %v, want a non-retryable ErrPermissionDenied saying %q", what, err, want)
		}
	}
	before := queues()
	for i := range 50 {
		topic := fmt.Sprintf("fresh.%d", i)
		_, err := pub.PublishText(ctx, topic, "x")
		denied("publish "+topic, err, fmt.Sprintf(`queue %q does not exist and creating it needs manage on topic %q, which user pub does not hold`, topic, topic))
	}
	_, err := pub.Subscribe(ctx, "fresh.sub")
	denied("subscribe fresh.sub", err, `queue "fresh.sub" does not exist and creating it needs manage on topic "fresh.sub"`)
	_, err = pub.Publish(ctx, "fresh.grouped", []byte("x"), WithGroup("g"))
	denied("publish fresh.grouped group g", err, `queue "fresh.grouped" group "g" does not exist`)
	if n := queues(); n != before {
		t.Fatalf("%d queues after the refused creations, want %d", n, before)
	}

	// A queue that exists: publish and consume need no manage.
	machine := dialT(t, rb.Addr, WithCredentials("machine-token"))
	if _, err := machine.DeclareQueue(ctx, "orders", QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.PublishText(ctx, "orders", "one"); err != nil {
		t.Fatalf("publish to an existing queue: %v", err)
	}
	sub, err := pub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatalf("subscribe to an existing queue: %v", err)
	}
	if m := recv(t, sub); m.Text() != "one" {
		t.Fatalf("got %q", m.Body)
	}

	// Manage on the topic creates on first use; the static token and an
	// anonymous peer (every permission) too, as in the quick start.
	owner := dialT(t, rb.Addr, WithUser("owner", "owner password"))
	if _, err := owner.PublishText(ctx, "mine.a", "x"); err != nil {
		t.Fatalf("owner creates mine.a: %v", err)
	}
	if _, err := owner.Subscribe(ctx, "mine.b"); err != nil {
		t.Fatalf("owner creates mine.b by subscribing: %v", err)
	}
	_, err = owner.PublishText(ctx, "theirs", "x")
	denied("owner publish theirs", err, `queue "theirs" does not exist`)
	if _, err := machine.PublishText(ctx, "by-token", "x"); err != nil {
		t.Fatalf("token creates on first use: %v", err)
	}
	anon := dialT(t, rb.Addr)
	if _, err := anon.PublishText(ctx, "by-anonymous", "x"); err != nil {
		t.Fatalf("anonymous creates on first use: %v", err)
	}
	if n, want := queues(), before+5; n != want {
		t.Fatalf("%d queues, want %d (orders, mine.a, mine.b, by-token, by-anonymous)", n, want)
	}
	if err := pub.Err(); err != nil {
		t.Fatalf("a denial failed the client: %v", err)
	}
}

// TestRealReservedTopics: against the real broker, topics under "sinew."
// are the broker's. A user who may publish everywhere cannot publish into
// the dead-letter queue (a forged dead letter an operator might replay),
// whether it exists or not, nor declare it; one who may consume it drains
// it, as a dead-letter worker does. The broker's own dead-lettering still
// fills it, and a principal that may manage it publishes there.
func TestRealReservedTopics(t *testing.T) {
	rb := startRealBroker(t, func(c *server.Config) { c.AuthTokens = []string{"machine-token"} })
	users := rb.Broker.Users()
	if err := users.Add("app", "app password", auth.Permissions{Publish: []string{"*"}, Consume: []string{"*"}, Manage: []string{"jobs"}}); err != nil {
		t.Fatal(err)
	}
	if err := users.Add("ops", "ops password", auth.Permissions{Publish: []string{"sinew.*"}, Manage: []string{"sinew.*"}}); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	app := dialT(t, rb.Addr, WithUser("app", "app password"))
	reserved := func(what string, err error) {
		t.Helper()
		want := `topic "sinew.dead-letter" is reserved for the broker (prefix "sinew."): publishing to it needs manage on it, which user app does not hold`
		if !errors.Is(err, ErrPermissionDenied) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s = %v, want ErrPermissionDenied saying %q", what, err, want)
		}
	}
	// Before the dead-letter queue exists.
	_, err := app.PublishText(ctx, "sinew.dead-letter", "forged")
	reserved("publish before it exists", err)

	// The broker dead-letters a failed message on its own.
	if _, err := app.DeclareQueue(ctx, "jobs", QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := app.PublishText(ctx, "jobs", "real"); err != nil {
		t.Fatal(err)
	}
	jobs, err := app.Subscribe(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	if err := recv(t, jobs).Fail(ctx); err != nil {
		t.Fatal(err)
	}
	// The broker's dead-letter worker creates the queue and copies the
	// message after the FAIL is answered; app may consume the queue but
	// not create it, so it waits for the copy.
	for {
		ready := uint64(0)
		if q, err := rb.Broker.QueueStatsOf("sinew.dead-letter", ""); err == nil {
			for _, p := range q.Partitions {
				ready += uint64(p.Ready)
			}
		}
		if ready > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the dead-letter copy never arrived")
		case <-time.After(5 * time.Millisecond): // polling a broker's worker
		}
	}
	dead, err := app.Subscribe(ctx, "sinew.dead-letter")
	if err != nil {
		t.Fatalf("consume the dead-letter queue: %v", err)
	}
	m := recv(t, dead)
	if src, _ := m.Header("sinew.source.topic"); m.Text() != "real" || src != "jobs" {
		t.Fatalf("dead letter %q from %q", m.Body, src)
	}

	// Now that it exists: still no publish, and no declaration.
	_, err = app.PublishText(ctx, "sinew.dead-letter", "forged")
	reserved("publish once it exists", err)
	_, err = app.PublishText(ctx, "sinew.other", "x")
	if !errors.Is(err, ErrPermissionDenied) || !strings.Contains(err.Error(), `topic "sinew.other" is reserved for the broker`) {
		t.Fatalf("publish sinew.other = %v", err)
	}
	_, err = app.DeclareQueue(ctx, "sinew.dead-letter", QueueConfig{})
	if !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("declare sinew.dead-letter = %v, want ErrPermissionDenied", err)
	}

	// Manage on the reserved name, or a static token, may publish there.
	ops := dialT(t, rb.Addr, WithUser("ops", "ops password"))
	if _, err := ops.PublishText(ctx, "sinew.dead-letter", "by ops"); err != nil {
		t.Fatalf("ops publish: %v", err)
	}
	machine := dialT(t, rb.Addr, WithCredentials("machine-token"))
	if _, err := machine.PublishText(ctx, "sinew.dead-letter", "by token"); err != nil {
		t.Fatalf("token publish: %v", err)
	}
	for _, want := range []string{"by ops", "by token"} {
		if m := recv(t, dead); m.Text() != want {
			t.Fatalf("dead-letter queue got %q, want %q", m.Body, want)
		}
	}
}
