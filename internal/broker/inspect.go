package broker

import (
	"context"
	"strconv"
	"strings"

	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/protocol"
)

// Operator views: a queue's stored configuration, inspection of its
// messages, removal of one message, and the broker-wide counters. They
// serve the admin API; none of them leases or settles a message.

// QueueConfig is a queue's stored declaration.
type QueueConfig struct {
	Partitions       uint32
	LeaseMs          int64
	MaxRetries       int
	DefaultTTLMs     int64
	DeadLetterMode   uint8
	DeadLetterTarget string
	// DeadLetterQueue is set on a dead-letter queue, which keeps every
	// message (deadletter.go).
	DeadLetterQueue bool
}

// Declaration returns c as the DeclareQueue that would leave the queue
// topic/group as it is (its update sets these same values).
func (c QueueConfig) Declaration(topic, group string) protocol.DeclareQueue {
	return protocol.DeclareQueue{Topic: topic, Group: group, Partitions: c.Partitions,
		DeadLetterMode: c.DeadLetterMode, DeadLetterTarget: c.DeadLetterTarget,
		MaxRetries: int32(c.MaxRetries), DefaultTTLMs: c.DefaultTTLMs, LeaseMs: c.LeaseMs}
}

// Config returns the stored configuration of queue topic/group.
func (b *Broker) Config(topic, group string) (QueueConfig, error) {
	m := new(queueMeta)
	if cm, ok := b.catalogueElsewhere(topic, group); ok {
		*m = cm // a cluster's queue held by other nodes
	} else {
		q, err := b.lookup(topic, group)
		if err != nil {
			return QueueConfig{}, err
		}
		m = q.meta.Load()
	}
	return QueueConfig{Partitions: m.Partitions, LeaseMs: m.LeaseMs, MaxRetries: m.MaxRetries,
		DefaultTTLMs: m.DefaultTTLMs, DeadLetterMode: m.DeadLetterMode, DeadLetterTarget: m.DeadLetterTarget,
		DeadLetterQueue: m.DeadLetterQueue}, nil
}

// QueueStatsOf returns one queue's counters, as Stats would list them.
func (b *Broker) QueueStatsOf(topic, group string) (QueueStats, error) {
	if _, ok := b.catalogueElsewhere(topic, group); ok {
		if cq, ok := b.cfg.Cluster.Lookup(topic, group); ok {
			qst := QueueStats{Topic: topic, Group: group, ReplicationWant: b.cfg.Cluster.ReplicationWant()}
			for i, pl := range cq.Partitions {
				ps := PartitionStats{Partition: uint32(i), Elsewhere: true, RaftGroup: pl.RaftGroup}
				for _, r := range pl.Replicas {
					ps.Replicas = append(ps.Replicas, b.cfg.Cluster.ClientAddr(r))
				}
				qst.Partitions = append(qst.Partitions, ps)
			}
			return qst, nil
		}
	}
	q, err := b.lookup(topic, group)
	if err != nil {
		return QueueStats{}, err
	}
	return b.statsOfQueue(q), nil
}

// DeadLetterTopic is the broker-wide dead-letter queue's topic (its group
// is the default group "").
func (b *Broker) DeadLetterTopic() string { return b.cfg.DeadLetterTopic }

// Counters returns the counters that all the broker's partitions share.
func (b *Broker) Counters() *partition.Counters { return b.counters }

// partitionOf finds partition idx of queue topic/group. In a cluster, a
// queue of the catalogue that this node holds no replica of is not_owner,
// naming a node that holds one.
func (b *Broker) partitionOf(topic, group string, idx uint32) (*queueEntry, *partition.Partition, error) {
	q, err := b.lookup(topic, group)
	if err != nil {
		if _, elsewhere := b.catalogueElsewhere(topic, group); elsewhere {
			if cq, ok := b.cfg.Cluster.Lookup(topic, group); ok {
				return nil, nil, b.elsewhereError(queueKey{topic, group}, &cq)
			}
		}
		return nil, nil, err
	}
	if idx >= uint32(len(q.parts)) {
		return nil, nil, protocol.Errorf(protocol.CodeNotFound, "queue %q group %q has no partition %d (it has %d)", topic, group, idx, len(q.parts))
	}
	return q, q.parts[idx], nil
}

// Peek returns up to limit unsettled messages of one partition from offset
// from upward, without leasing or settling anything (partition.Peek).
func (b *Broker) Peek(ctx context.Context, topic, group string, idx uint32, from uint64, limit int) (partition.PeekResult, error) {
	if !b.ready.Load() {
		return partition.PeekResult{}, ErrStarting
	}
	q, p, err := b.partitionOf(topic, group, idx)
	if err != nil {
		return partition.PeekResult{}, err
	}
	r, err := p.Peek(ctx, from, limit)
	if err != nil {
		return r, b.partitionError("peek", q, idx, err)
	}
	return r, nil
}

// Discard removes the queued message at offset of one partition; done is
// called once the removal is durable, or with partition.ErrNotQueued.
func (b *Broker) Discard(topic, group string, idx uint32, offset uint64, done func(error)) {
	if !b.ready.Load() {
		done(ErrStarting)
		return
	}
	q, p, err := b.partitionOf(topic, group, idx)
	if err != nil {
		done(err)
		return
	}
	p.Discard(offset, func(err error) {
		if err != nil && err != partition.ErrNotQueued {
			err = b.partitionError("discard", q, idx, err)
		}
		done(err)
	})
}

// DeadLetterSource is where a dead-letter copy came from and why, read
// from the reserved headers the partition put on it.
type DeadLetterSource struct {
	Topic, Group     string
	Partition        uint32
	Offset           uint64
	Reason           string
	Retries          uint32
	DeadLetteredAtMs int64
	// OK is false when the copy lacks the source topic header: it was not
	// made by a dead-lettering partition.
	OK bool
}

// DeadLetterSourceOf reads the reserved headers of a dead-letter copy.
func DeadLetterSourceOf(hs []queue.Header) DeadLetterSource {
	var s DeadLetterSource
	for _, h := range hs {
		switch h.Key {
		case partition.HeaderSourceTopic:
			s.Topic, s.OK = h.Value, true
		case partition.HeaderSourceGroup:
			s.Group = h.Value
		case partition.HeaderSourcePartition:
			v, _ := strconv.ParseUint(h.Value, 10, 32)
			s.Partition = uint32(v)
		case partition.HeaderSourceOffset:
			s.Offset, _ = strconv.ParseUint(h.Value, 10, 64)
		case partition.HeaderReason:
			s.Reason = h.Value
		case partition.HeaderRetries:
			v, _ := strconv.ParseUint(h.Value, 10, 32)
			s.Retries = uint32(v)
		case partition.HeaderDeadLetteredAt:
			s.DeadLetteredAtMs, _ = strconv.ParseInt(h.Value, 10, 64)
		}
	}
	return s
}

// ReplayPublish builds the publish that puts the dead-letter copy m back
// on its source queue: its key, content type, body and application
// headers, without the reserved sinew.* headers.
func ReplayPublish(src DeadLetterSource, m *queue.Message) *protocol.Publish {
	p := &protocol.Publish{Topic: src.Topic, Group: src.Group, Partition: -1,
		Key: m.Key, ContentType: m.ContentType, Body: m.Body}
	for _, h := range m.Headers {
		if !strings.HasPrefix(h.Key, partition.ReservedHeaderPrefix) {
			p.Headers = append(p.Headers, protocol.Header(h))
		}
	}
	return p
}
