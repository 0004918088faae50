package server

import (
	"fmt"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/protocol"
)

// Permission checks. Every client request that names a topic asks permit
// before it reaches the broker, on the reader goroutine, so a denied request
// costs no broker work and holds no in-flight slot:
//
//	request                      action   topic checked
//	PUBLISH                      publish  its topic
//	  to a reserved topic        manage   its topic, as well
//	SUBSCRIBE                    consume  its topic
//	RECONCILE (restore policy)   consume  each subscription it would recreate
//	PUBLISH, SUBSCRIBE, RECONCILE
//	  that creates its queue     manage   the topic of the queue created
//	DECLARE_QUEUE                manage   its topic, and its dead_letter_target
//	DELETE_QUEUE, PURGE_QUEUE    manage   its topic
//
// A queue created on first use counts against the broker's queue budget
// (limits.queues_max) like a declared one, so creating it is a manage
// action: without that check a principal that may only publish could use
// the budget up by publishing to new names. The check runs in the backend
// at the moment of creation (session.MayCreate), so a request to a queue
// that exists is never refused by it, and in a cluster a queue the
// catalogue holds (placed on other nodes) exists.
//
// Topics under auth.ReservedTopicPrefix ("sinew.") are the broker's: the
// dead-letter queue and its copies live there, and an operator may replay
// what it holds into other queues, so a message published there by hand
// would be a forged dead letter. Publishing to one needs manage on it as
// well as publish. Consuming from one needs consume only (draining the
// dead-letter queue is a worker's job), and declaring one needs manage, as
// any declaration does.
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
	c.denied(a, topic)
	return protocol.Errorf(protocol.CodePermissionDenied, "%s may not %s topic %q", c.principalLabel(), a, topic)
}

// denied counts and logs a refused request that needed a on topic.
func (c *conn) denied(a auth.Action, topic string) {
	c.srv.stats.permissionDenials.Add(1)
	// Debug, not Info: a peer can send denied requests as fast as it can
	// write, and the counter already tells the operator it happens.
	c.log.Debug("permission denied", "principal", c.principal.Name, "principal_kind", c.principal.Kind.String(),
		"action", a.String(), "topic", topic)
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

// permitPublish checks a PUBLISH: publish on the topic, and manage too when
// the topic is reserved for the broker.
func (c *conn) permitPublish(topic string) error {
	if err := c.permit(auth.ActionPublish, topic); err != nil {
		return err
	}
	if !auth.Reserved(topic) || c.principal.Allows(auth.ActionManage, topic) {
		return nil
	}
	c.denied(auth.ActionManage, topic)
	return protocol.Errorf(protocol.CodePermissionDenied,
		"topic %q is reserved for the broker (prefix %q): publishing to it needs manage on it, which %s does not hold",
		topic, auth.ReservedTopicPrefix, c.principalLabel())
}

// mayCreate returns the check that decides whether a request on topic may
// create its queue on first use: nil when the principal may manage the
// topic (nothing to check, on the hot path of every publish), createCheck
// otherwise.
func (c *conn) mayCreate(topic string) session.MayCreate {
	if c.principal.Allows(auth.ActionManage, topic) {
		return nil
	}
	return c.createCheck
}

// createCheck is the session.MayCreate of this connection's principal:
// creating a queue needs manage on its topic. The backend calls it, maybe on
// another goroutine, only when the queue does not exist.
func (c *conn) createCheck(topic, group string) error {
	if c.principal.Allows(auth.ActionManage, topic) {
		return nil
	}
	c.denied(auth.ActionManage, topic)
	q := fmt.Sprintf("queue %q", topic)
	if group != "" {
		q += fmt.Sprintf(" group %q", group)
	}
	return protocol.Errorf(protocol.CodePermissionDenied,
		"%s does not exist and creating it needs manage on topic %q, which %s does not hold", q, topic, c.principalLabel())
}

// backendPublish hands p to the backend, with the principal's creation
// check when the backend takes one.
func (c *conn) backendPublish(p *protocol.Publish, done func(protocol.PublishOK, error)) {
	if g, ok := c.srv.cfg.Backend.(session.CreateGuard); ok {
		g.PublishChecked(p, c.mayCreate(p.Topic), done)
		return
	}
	c.srv.cfg.Backend.Publish(p, done)
}
