package server

import (
	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/protocol"
)

// Permission checks. Every client request that names a topic asks permit
// before it reaches the broker, on the reader goroutine, so a denied request
// costs no broker work and holds no in-flight slot:
//
//	request                      action   topic checked
//	PUBLISH                      publish  its topic
//	SUBSCRIBE                    consume  its topic
//	RECONCILE (restore policy)   consume  each subscription it would recreate
//	DECLARE_QUEUE                manage   its topic, and its dead_letter_target
//	DELETE_QUEUE, PURGE_QUEUE    manage   its topic
//
// Settles (ACK, NACK, FAIL) are not checked: they name delivery tags, and a
// tag is only ever issued to a subscription that passed its consume check.
// Copies the broker makes on its own (dead-lettering a failed message) are
// not the user's requests and are not checked either.
//
// A denial is a request-level permission_denied: the connection, the session
// and its other subscriptions carry on.

// permit reports whether the connection's principal may do a on topic, and
// the permission_denied to answer with when it may not.
func (c *conn) permit(a auth.Action, topic string) error {
	if c.principal.Allows(a, topic) {
		return nil
	}
	c.srv.stats.permissionDenials.Add(1)
	// Debug, not Info: a peer can send denied requests as fast as it can
	// write, and the counter already tells the operator it happens.
	c.log.Debug("permission denied", "principal", c.principal.Name, "principal_kind", c.principal.Kind.String(),
		"action", a.String(), "topic", topic)
	return protocol.Errorf(protocol.CodePermissionDenied, "%s may not %s topic %q", c.principalLabel(), a, topic)
}

// principalLabel names the principal in an error the peer reads: it is the
// peer's own identity, so naming it leaks nothing.
func (c *conn) principalLabel() string {
	if c.principal.Name == "" {
		return c.principal.Kind.String()
	}
	return c.principal.Kind.String() + " " + c.principal.Name
}

// permitDeclare checks a DECLARE_QUEUE: manage on the topic, and on the
// dead-letter target it names, because failed messages will be copied
// there; without that check a user could route messages into a topic it
// may not touch.
func (c *conn) permitDeclare(d *protocol.DeclareQueue) error {
	if err := c.permit(auth.ActionManage, d.Topic); err != nil {
		return err
	}
	if d.DeadLetterMode == protocol.DeadLetterQueue && d.DeadLetterTarget != "" {
		return c.permit(auth.ActionManage, d.DeadLetterTarget)
	}
	return nil
}
