package server

import (
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/protocol"
)

// expectDenied reads the ERROR answering request id and checks it is a
// request-level permission_denied.
func (c *client) expectDenied(id uint64) {
	c.t.Helper()
	h, e := expect[*protocol.ErrorBody](c)
	if h.RequestID != id || e.Code != protocol.CodePermissionDenied || e.Fatal {
		c.t.Fatalf("got ERROR %+v for request %d, want a non-fatal permission_denied for %d", e, h.RequestID, id)
	}
}

// TestPermissionChecksOnTheWire covers what the SDK test cannot reach: a
// DECLARE whose dead-letter target is outside the user's manage patterns, a
// NO_REPLY publish that is denied (it still hears ERROR), and a restore
// RECONCILE that must not recreate a subscription SUBSCRIBE would refuse.
// The connection answers PING after every denial.
func TestPermissionChecksOnTheWire(t *testing.T) {
	users := newUsers(t)
	all := []string{"in.*"}
	if err := users.Add("bob", "correct horse", auth.Permissions{Publish: all, Consume: all, Manage: all}); err != nil {
		t.Fatal(err)
	}
	fx := start(t, func(c *Config) { c.Users, c.AuthFailureDelayMs = users, -1 })
	c := fx.dial()
	c.hello(protocol.Hello{User: "bob", Credentials: "correct horse"})

	// DECLARE: manage on the topic and on the dead-letter target.
	id := c.send(0, &protocol.DeclareQueue{Topic: "in.q", MaxRetries: -1, DeadLetterMode: protocol.DeadLetterQueue, DeadLetterTarget: "out.dlq"})
	c.expectDenied(id)
	c.ping()
	c.send(0, &protocol.DeclareQueue{Topic: "in.q", MaxRetries: -1, DeadLetterMode: protocol.DeadLetterQueue, DeadLetterTarget: "in.dlq"})
	expect[*protocol.DeclareOK](c)
	id = c.send(0, &protocol.DeclareQueue{Topic: "out.q", MaxRetries: -1})
	c.expectDenied(id)

	// PUBLISH with NO_REPLY: no PUBLISH_OK, but a denial is still answered.
	id = c.send(protocol.FlagNoReply, &protocol.Publish{Topic: "out", Partition: -1, Body: []byte("x")})
	c.expectDenied(id)
	c.ping()
	c.publish("in.z", "ok")

	// DELETE and PURGE.
	id = c.send(0, &protocol.DeleteQueue{Topic: "out.q"})
	c.expectDenied(id)
	id = c.send(0, &protocol.PurgeQueue{Topic: "out.q"})
	c.expectDenied(id)

	// RECONCILE (restore) recreates in.a, refuses out.b.
	id = c.send(0, &protocol.Reconcile{Policy: protocol.ReconcileRestore, Subs: []protocol.SubView{
		{SubID: 7, Topic: "in.a", Prefetch: 1},
		{SubID: 8, Topic: "out.b", Prefetch: 1},
	}})
	h, r := expect[*protocol.ReconcileResult](c)
	if h.RequestID != id || len(r.Entries) != 2 {
		t.Fatalf("RECONCILE_RESULT %+v for %d", r, h.RequestID)
	}
	if e := r.Entries[0]; e.Action != protocol.ActionRecreateClient {
		t.Fatalf("in.a: %+v, want recreated", e)
	}
	if e := r.Entries[1]; e.Action != protocol.ActionCloseClientSide || !strings.Contains(e.Reason, "permission_denied") {
		t.Fatalf("out.b: %+v, want close_client_side for permission_denied", e)
	}
	c.ping()

	st := fx.srv.Stats()
	if st.PermissionDenials != 6 || st.FatalErrors != 0 || st.ConnectionsOpen != 1 {
		t.Fatalf("stats: %d denials, %d fatal, %d open; want 6, 0, 1", st.PermissionDenials, st.FatalErrors, st.ConnectionsOpen)
	}
}
