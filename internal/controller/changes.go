package controller

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Runtime is the cluster's runtime settings: every node applies the
// committed document to its own (internal/runtimesettings). The controller
// stores the values and does not read them; nodes check them before they
// propose.
type Runtime struct {
	// Version goes up by one with every accepted change.
	Version uint64           `json:"version"`
	Values  map[string]int64 `json:"values"`
	// ID names the proposal that set this version, so that its proposer
	// tells its own change from a racing one.
	ID string `json:"id,omitempty"`
}

// ErrNoQueue is returned for a queue the catalogue does not hold.
var ErrNoQueue = errors.New("controller: no such queue in the catalogue")

// sameQueue reports whether the command names queue q: its topic, group
// and, when the command gives one, the index that created it (a queue
// deleted and created again is another queue).
func sameQueue(c *command, q *Queue) bool {
	return c.Queue.CreatedAt == 0 || c.Queue.CreatedAt == q.CreatedAt
}

// applyDeleteQueue removes a queue from the catalogue. Its raft groups are
// never reused; each node drops its replicas once it applies the entry.
func (t *Table) applyDeleteQueue(c *command) error {
	if c.Queue == nil || c.Queue.Topic == "" {
		return errCommandf("delete_queue without a queue")
	}
	i, ok := t.findQueue(c.Queue.Topic, c.Queue.Group)
	if !ok || !sameQueue(c, &t.Queues[i]) {
		return nil
	}
	t.Queues = slices.Delete(slices.Clone(t.Queues), i, i+1) // a Status may share the old slice
	t.dropCohorts(c.Queue.Topic, c.Queue.Group)
	return nil
}

// applyUpdateQueue replaces a queue's declaration (its settings).
func (t *Table) applyUpdateQueue(c *command) error {
	if c.Queue == nil || c.Queue.Topic == "" || len(c.Queue.Settings) == 0 {
		return errCommandf("update_queue without a queue or settings")
	}
	i, ok := t.findQueue(c.Queue.Topic, c.Queue.Group)
	if !ok || !sameQueue(c, &t.Queues[i]) {
		return nil
	}
	q := t.Queues[i]
	q.Settings = slices.Clone(c.Queue.Settings)
	t.Queues = slices.Clone(t.Queues)
	t.Queues[i] = q
	return nil
}

// applyPlacementDone clears a partition's Moving flag when the command
// names its current raft group and replicas: its owner saw the group's
// voters become exactly those replicas.
func (t *Table) applyPlacementDone(c *command) error {
	if c.Queue == nil || c.Queue.Topic == "" || c.RaftGroup == 0 {
		return errCommandf("placement_done without a queue or group")
	}
	i, ok := t.findQueue(c.Queue.Topic, c.Queue.Group)
	if !ok || c.Partition < 0 || c.Partition >= len(t.Queues[i].Partitions) {
		return nil
	}
	q := t.Queues[i]
	pl := q.Partitions[c.Partition]
	if pl.RaftGroup != c.RaftGroup || !slices.Equal(pl.Replicas, c.Replicas) || !pl.Moving {
		return nil
	}
	q.Partitions = slices.Clone(q.Partitions)
	pl.Moving = false
	q.Partitions[c.Partition] = pl
	t.Queues = slices.Clone(t.Queues)
	t.Queues[i] = q
	return nil
}

// applySetRuntime replaces the runtime settings when the command was based
// on the current version (0: none yet) and names a later one; otherwise it
// is applied as nothing, the same way on every replica, and the proposer
// sees a conflict.
func (t *Table) applySetRuntime(c *command) error {
	if c.Runtime == nil || c.Runtime.Values == nil {
		return errCommandf("set_runtime without settings")
	}
	cur := uint64(0)
	if t.Runtime != nil {
		cur = t.Runtime.Version
	}
	if cur != c.Expected || c.Runtime.Version <= cur {
		return nil
	}
	t.Runtime = &Runtime{Version: c.Runtime.Version, Values: maps.Clone(c.Runtime.Values), ID: c.Runtime.ID}
	return nil
}

func errCommandf(what string) error { return fmt.Errorf("%w: %s", ErrCommand, what) }

// DeleteQueue removes a queue from the catalogue and returns once this
// node applied that, or ctx ends. A queue the catalogue does not hold is
// ErrNoQueue.
func (c *Controller) DeleteQueue(ctx context.Context, topic, group string) error {
	q, ok := c.Status().Table.Queue(topic, group)
	if !ok {
		return ErrNoQueue
	}
	data, err := encode(command{Op: opDeleteQueue, Queue: &Queue{Topic: topic, Group: group, CreatedAt: q.CreatedAt}})
	if err != nil {
		return err
	}
	return c.proposeUntil(ctx, data, func(st Status) bool {
		cur, ok := st.Table.Queue(topic, group)
		return !ok || cur.CreatedAt != q.CreatedAt
	})
}

// UpdateQueue replaces a queue's settings in the catalogue and returns the
// queue once this node applied the change, or ctx ends. A queue the
// catalogue does not hold (or no longer: deleted meanwhile) is ErrNoQueue.
func (c *Controller) UpdateQueue(ctx context.Context, topic, group string, settings []byte) (Queue, error) {
	q, ok := c.Status().Table.Queue(topic, group)
	if !ok {
		return Queue{}, ErrNoQueue
	}
	data, err := encode(command{Op: opUpdateQueue, Queue: &Queue{Topic: topic, Group: group, CreatedAt: q.CreatedAt, Settings: settings}})
	if err != nil {
		return Queue{}, err
	}
	var cur Queue
	gone := false
	err = c.proposeUntil(ctx, data, func(st Status) bool {
		cur, ok = st.Table.Queue(topic, group)
		gone = !ok || cur.CreatedAt != q.CreatedAt
		return gone || bytes.Equal(cur.Settings, settings)
	})
	if err == nil && gone {
		err = ErrNoQueue
	}
	return cur, err
}

// PlacementDone reports, from partition's owner, that the group's voters
// are exactly replicas. It proposes and does not wait: the owner reports
// again while the catalogue still shows the partition Moving.
func (c *Controller) PlacementDone(topic, group string, partition int, raftGroup uint64, replicas []uint64) {
	data, err := encode(command{Op: opPlacementDone, Queue: &Queue{Topic: topic, Group: group},
		Partition: partition, RaftGroup: raftGroup, Replicas: replicas})
	if err != nil {
		return
	}
	c.propose(data)
}

// SetRuntime proposes values as the runtime settings' version version,
// based on version expected (0: the catalogue holds none yet), and waits
// until this node applied it or a racing change, or ctx ends. It returns
// the settings in force and whether they are this proposal's; when they
// are not, the change was refused for a conflict.
func (c *Controller) SetRuntime(ctx context.Context, expected, version uint64, values map[string]int64) (Runtime, bool, error) {
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	id := hex.EncodeToString(idb[:])
	data, err := encode(command{Op: opSetRuntime, Expected: expected, Runtime: &Runtime{Version: version, Values: values, ID: id}})
	if err != nil {
		return Runtime{}, false, err
	}
	var cur *Runtime
	err = c.proposeUntil(ctx, data, func(st Status) bool {
		cur = st.Table.Runtime
		return cur != nil && cur.Version != expected
	})
	if err != nil {
		return Runtime{}, false, err
	}
	return *cur, cur.ID == id, nil
}

// applyPurgeQueue records a purge of a queue at index; each partition's
// owner carries it out (PurgeDone).
func (t *Table) applyPurgeQueue(index uint64, c *command) error {
	if c.Queue == nil || c.Queue.Topic == "" {
		return errCommandf("purge_queue without a queue")
	}
	i, ok := t.findQueue(c.Queue.Topic, c.Queue.Group)
	if !ok || !sameQueue(c, &t.Queues[i]) {
		return nil
	}
	q := t.Queues[i]
	q.PurgeSeq = index
	if len(q.PurgeDone) != len(q.Partitions) {
		q.PurgeDone, q.PurgeCount = make([]uint64, len(q.Partitions)), make([]uint64, len(q.Partitions))
	}
	t.Queues = slices.Clone(t.Queues)
	t.Queues[i] = q
	return nil
}

// applyPurgeDone records that a partition's owner carried out the purge
// Seq, when it is the queue's last.
func (t *Table) applyPurgeDone(c *command) error {
	if c.Queue == nil || c.Queue.Topic == "" || c.Seq == 0 {
		return errCommandf("purge_done without a queue or purge")
	}
	i, ok := t.findQueue(c.Queue.Topic, c.Queue.Group)
	if !ok {
		return nil
	}
	q := t.Queues[i]
	if q.PurgeSeq != c.Seq || c.Partition < 0 || c.Partition >= len(q.PurgeDone) || q.PurgeDone[c.Partition] == c.Seq {
		return nil
	}
	q.PurgeDone, q.PurgeCount = slices.Clone(q.PurgeDone), slices.Clone(q.PurgeCount)
	q.PurgeDone[c.Partition], q.PurgeCount[c.Partition] = c.Seq, c.Count
	t.Queues = slices.Clone(t.Queues)
	t.Queues[i] = q
	return nil
}

// PurgeQueue records a purge of a queue and returns its sequence (the
// entry's index) once this node applied it, or ctx ends. A queue the
// catalogue does not hold is ErrNoQueue.
func (c *Controller) PurgeQueue(ctx context.Context, topic, group string) (uint64, error) {
	q, ok := c.Status().Table.Queue(topic, group)
	if !ok {
		return 0, ErrNoQueue
	}
	data, err := encode(command{Op: opPurgeQueue, Queue: &Queue{Topic: topic, Group: group, CreatedAt: q.CreatedAt}})
	if err != nil {
		return 0, err
	}
	var cur Queue
	gone := false
	err = c.proposeUntil(ctx, data, func(st Status) bool {
		cur, ok = st.Table.Queue(topic, group)
		gone = !ok || cur.CreatedAt != q.CreatedAt
		return gone || cur.PurgeSeq > q.PurgeSeq
	})
	if err == nil && gone {
		err = ErrNoQueue
	}
	return cur.PurgeSeq, err
}

// PurgeDone reports, from a partition's owner, that it carried out purge
// seq and discarded count messages. It proposes and does not wait.
func (c *Controller) PurgeDone(topic, group string, partition int, seq, count uint64) {
	data, err := encode(command{Op: opPurgeDone, Queue: &Queue{Topic: topic, Group: group}, Partition: partition, Seq: seq, Count: count})
	if err != nil {
		return
	}
	c.propose(data)
}
