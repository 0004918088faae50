package broker

import (
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/protocol"
)

// Dead-letter queues keep what they hold.
//
// A dead-letter queue is the last place a failed message goes, so it never
// dead-letters or discards anything itself: a message leaves it only when a
// consumer completes it (or an operator purges the queue). In the queue
// state machine this is queue.DeadLetterPolicy.Keep: no retry limit, no TTL,
// and FAIL puts the message back to ready at once, as a NACK without delay
// would. A queue keeps when any of these holds:
//
//	rule                                             why
//	-----------------------------------------------  -------------------------------------------
//	it is the global dead-letter queue               by name (Config.DeadLetterTopic, group ""),
//	                                                 whoever created it: also one created by an
//	                                                 older broker with max_retries 5
//	it was created as a dead-letter target           meta dead_letter_queue: the first dead
//	                                                 letter to a named target created it
//	its stored dead-letter policy points into itself metadata written before such declarations
//	                                                 were refused; it used to discard
//
// A declaration whose dead-letter policy points into the queue itself is
// refused with bad_request (refuseSelfDeadLetter). The global dead-letter
// queue may be declared with the default mode, which for it means "keep".
// A named target that already existed when the first message was
// dead-lettered to it keeps its own settings; its failures go on to its own
// dead-letter policy (by default the global dead-letter queue, which keeps).

// keepReason says why the queue described by m keeps every message, or ""
// when it does not.
func (b *Broker) keepReason(m *queueMeta) string {
	switch {
	case m.Group == "" && m.Topic == b.cfg.DeadLetterTopic:
		return "global dead-letter queue"
	case m.DeadLetterQueue:
		return "created as a dead-letter queue"
	case m.Group == "" && m.Topic == b.resolvedDeadLetterTopic(m):
		return "its dead-letter policy points into itself"
	}
	return ""
}

// resolvedDeadLetterTopic is the topic m's dead-letter policy names, before
// any keep rule: "" for discard.
func (b *Broker) resolvedDeadLetterTopic(m *queueMeta) string {
	switch m.DeadLetterMode {
	case protocol.DeadLetterDiscard:
		return ""
	case protocol.DeadLetterQueue:
		return m.DeadLetterTarget
	}
	return b.cfg.DeadLetterTopic
}

// refuseSelfDeadLetter refuses a declaration whose dead-letter policy points
// into the declared queue itself: failed messages would be copied into the
// queue they failed in, or, as before, silently discarded.
func (b *Broker) refuseSelfDeadLetter(d *protocol.DeclareQueue) error {
	if d.Group != "" {
		return nil // targets are default groups, never this queue
	}
	switch {
	case d.DeadLetterMode == protocol.DeadLetterQueue && d.DeadLetterTarget == d.Topic:
		return protocol.Errorf(protocol.CodeBadRequest,
			"dead_letter_target %q is the queue itself: a queue cannot dead-letter into itself", d.DeadLetterTarget)
	case d.DeadLetterMode == protocol.DeadLetterGlobal && d.Topic == b.cfg.DeadLetterTopic:
		return protocol.Errorf(protocol.CodeBadRequest,
			"queue %q is the global dead-letter queue: it cannot dead-letter into itself (it keeps every message)", d.Topic)
	}
	return nil
}

// logKeep tells the operator, when a queue is opened, that it keeps every
// message, and warns when that comes from metadata that points into itself.
func (b *Broker) logKeep(m *queueMeta) {
	switch why := b.keepReason(m); why {
	case "":
	case "its dead-letter policy points into itself":
		b.logger.Warn("queue's dead-letter policy points into itself; it keeps every message instead of discarding: retries unlimited, no TTL, FAIL requeues",
			"topic", m.Topic, "group", m.Group)
	default:
		b.logger.Info("dead-letter queue keeps every message until completed or purged: retries unlimited, no TTL, FAIL requeues",
			"topic", m.Topic, "group", m.Group, "why", why)
	}
}

// deadLetterQueue finds the queue a dead letter goes to, creating it on
// first use as a dead-letter queue (flagged in its metadata, so it keeps).
func (b *Broker) deadLetterQueue(topic string) (*queueEntry, error) {
	b.mu.RLock()
	q := b.queues[queueKey{topic, ""}]
	b.mu.RUnlock()
	if q != nil {
		return q, nil
	}
	q, _, err := b.declareQueue(&protocol.DeclareQueue{Topic: topic, MaxRetries: -1}, false, true, nil)
	return q, err
}

// keepConfig turns qc into the configuration of a queue that keeps.
func keepConfig(qc queue.Config) queue.Config {
	qc.DeadLetter = queue.DeadLetterPolicy{Keep: true}
	return qc
}
