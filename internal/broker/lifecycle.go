package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// trashDir, under DataDir/queues, holds deleted queues until their files
// are removed. A queue is deleted by one durable rename into it, so a crash
// leaves it either whole in its place or here, never half of it in place;
// Open empties it.
const trashDir = ".trash"

// isQueueDirName reports whether name can be a topic or group directory
// (see dirName).
func isQueueDirName(name string) bool {
	return strings.HasPrefix(name, "=") || strings.HasPrefix(name, "#")
}

// trashSeq makes trash names unique within the process; the broker's owner
// prefix makes them unique across restarts.
var trashSeq atomic.Uint64

// Delete removes the queue topic/group and everything in it: ready, delayed
// and inflight messages, and dead-letter copies not yet made. Its
// subscriptions end with protocol.SubClosedQueueDeleted, its partitions
// stop, and its directory is renamed durably into DataDir/queues/.trash and
// then removed, so once Delete returns nil the queue never comes back, even
// after a crash; the queue's partitions no longer count against the
// creation budget. A queue that does not exist is CodeNotFound. While the
// delete runs, creating the same queue is CodeUnavailable; afterwards a
// publish or subscribe creates a new, empty queue as on first use.
//
// In a cluster the removal is first committed to the controller's
// catalogue (CodeUnavailable when it cannot be, CodeNotFound when the
// catalogue does not hold the queue); this node then drops its replicas
// before Delete returns, and every other node when it applies the entry.
//
// ctx is checked before the delete starts; once started it runs to the end.
func (b *Broker) Delete(ctx context.Context, d *protocol.DeleteQueue) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validName("topic", d.Topic, false); err != nil {
		return err
	}
	if err := validName("group", d.Group, true); err != nil {
		return err
	}
	k := queueKey{d.Topic, d.Group}
	if b.cfg.Cluster != nil {
		// The catalogue first: once the removal is committed every node
		// drops its replicas (SyncCatalogue); this one does so now.
		if b.closed.Load() {
			return ErrShuttingDown
		}
		ctx, cancel := context.WithTimeout(ctx, clusterCreateTimeout)
		defer cancel()
		found, err := b.cfg.Cluster.DeleteQueue(ctx, d.Topic, d.Group)
		switch {
		case err != nil:
			return protocol.Errorf(protocol.CodeUnavailable, "queue %q group %q: the cluster did not commit its removal: %v; retry", d.Topic, d.Group, err)
		case !found:
			return protocol.Errorf(protocol.CodeNotFound, "no queue %q group %q in the cluster's catalogue", d.Topic, d.Group)
		}
		// SyncCatalogue may be dropping it already: then wait for that.
		if err := b.dropLocal(k, "deleted", true); err != nil && protocol.CodeOf(err) != protocol.CodeNotFound {
			return err
		}
		return nil
	}
	return b.dropLocal(k, "deleted", false)
}

// dropLocal removes this node's queue k and its files: a queue deleted, or
// in a cluster one whose replicas moved to other nodes (why "moved"), or
// the replicas of an incarnation the catalogue no longer holds. With wait,
// a removal already under way is waited for, and is a success.
func (b *Broker) dropLocal(k queueKey, why string, wait bool) error {
	d := &protocol.DeleteQueue{Topic: k.topic, Group: k.group}
	b.createMu.Lock()
	if b.closed.Load() {
		b.createMu.Unlock()
		return ErrShuttingDown
	}
	if running := b.deleting[k]; running != nil {
		b.createMu.Unlock()
		if wait {
			<-running
			return nil
		}
		return protocol.Errorf(protocol.CodeUnavailable, "queue %q group %q is already being deleted", d.Topic, d.Group)
	}
	b.mu.Lock()
	q := b.queues[k]
	if q != nil {
		delete(b.queues, k)
	}
	b.mu.Unlock()
	if q == nil {
		b.createMu.Unlock()
		return protocol.Errorf(protocol.CodeNotFound, "no queue %q group %q", d.Topic, d.Group)
	}
	q.deleted.Store(true)
	finished := make(chan struct{})
	b.deleting[k] = finished
	b.deletes.Add(1)
	b.createMu.Unlock()
	defer b.deletes.Done()

	// A Subscribe that registers after this scan sees q.deleted and
	// gives up; one registered before it is ended here.
	b.subsMu.Lock()
	var subs []*Subscription
	for _, s := range b.subs {
		if s.q == q {
			subs = append(subs, s)
		}
	}
	b.subsMu.Unlock()
	if why == "moved" {
		gone := protocol.Errorf(protocol.CodeNotOwner, "queue %q group %q is no longer held by this node", d.Topic, d.Group)
		for _, s := range subs {
			s.end(protocol.SubClosedError, gone, false)
		}
	} else {
		gone := protocol.Errorf(protocol.CodeNotFound, "queue %q group %q was deleted", d.Topic, d.Group)
		for _, s := range subs {
			s.end(protocol.SubClosedQueueDeleted, gone, false)
		}
	}
	if b.cfg.Cluster != nil {
		for _, r := range q.meta.Load().Raft {
			b.cfg.Cluster.RemoveGroup(r.RaftGroup)
		}
	}

	// Partitions stop without createMu held, so that a creation (the
	// dead-letter worker's, say) is not held up by a slow Close.
	var wg sync.WaitGroup
	for _, p := range q.parts {
		wg.Go(func() {
			// The final checkpoint of a queue being deleted does not
			// matter; a failure is only worth a note.
			if err := p.Close(); err != nil {
				b.logger.Warn("closing a deleted queue's partition", "topic", d.Topic, "group", d.Group,
					"partition", p.Index(), "err", err)
			}
		})
	}
	wg.Wait()

	b.createMu.Lock()
	trash, err := b.moveToTrash(q.dir)
	delete(b.deleting, k)
	close(finished)
	b.createMu.Unlock()
	if err != nil {
		b.logger.Error("queue deleted from service, but its directory could not be moved away; it returns after a restart",
			"op", "delete", "topic", d.Topic, "group", d.Group, "dir", q.dir, "err", err)
		return protocol.Errorf(protocol.CodeInternal,
			"queue %q group %q stopped, but its files could not be removed and it returns after a restart; the broker log has the cause",
			d.Topic, d.Group)
	}
	if b.wal != nil {
		// Durably gone: the WAL need not keep the queue's entries.
		b.walMu.Lock()
		for _, g := range q.walGroups {
			delete(b.walParts, g)
			delete(b.walStuck, g)
		}
		b.walMu.Unlock()
		for _, g := range q.walGroups {
			b.wal.Forget(g)
		}
	}
	if err := b.removeAll(trash); err != nil {
		// Durably gone already; Open finishes the removal.
		b.logger.Warn("removing a deleted queue's files; the next start retries", "dir", trash, "err", err)
	}
	if why == "moved" {
		b.logger.Info("queue replicas moved to other nodes; files removed", "topic", d.Topic, "group", d.Group, "partitions", len(q.parts))
	} else {
		b.logger.Info("queue deleted", "topic", d.Topic, "group", d.Group, "partitions", len(q.parts), "subscriptions", len(subs))
	}
	return nil
}

// moveToTrash renames dir into the trash durably and returns its new name.
// The emptied topic directory is removed when no other group uses it.
// Callers hold createMu, so no creation races the topic directory.
func (b *Broker) moveToTrash(dir string) (string, error) {
	root := filepath.Join(b.cfg.DataDir, queuesDir)
	tr := filepath.Join(root, trashDir)
	if err := b.cfg.FS.MkdirAll(tr, vfs.DirPerm); err != nil {
		return "", err
	}
	if err := b.cfg.FS.SyncDir(root); err != nil {
		return "", err
	}
	to := filepath.Join(tr, b.owner+"-"+strconv.FormatUint(trashSeq.Add(1), 10))
	if err := b.cfg.FS.Rename(dir, to); err != nil {
		return "", err
	}
	tdir := filepath.Dir(dir)
	if err := syncDirs(b.cfg.FS, tdir, tr); err != nil {
		return "", err
	}
	if left, err := b.cfg.FS.ReadDir(tdir); err == nil && len(left) == 0 {
		if b.cfg.FS.Remove(tdir) == nil {
			_ = b.cfg.FS.SyncDir(root) // an empty topic directory left behind is harmless
		}
	}
	return to, nil
}

// emptyTrash removes what deletions left in the trash directory.
func (b *Broker) emptyTrash(dir string) {
	names, err := b.cfg.FS.ReadDir(dir)
	if err != nil {
		b.logger.Warn("cannot read the trash of deleted queues", "dir", dir, "err", err)
		return
	}
	for _, n := range names {
		if err := b.removeAll(filepath.Join(dir, n)); err != nil {
			b.logger.Warn("cannot remove a deleted queue's files", "dir", filepath.Join(dir, n), "err", err)
		}
	}
}

// removeAll removes name and everything below it (vfs.FS has no RemoveAll).
// Only names the broker created are passed, so the depth is small.
func (b *Broker) removeAll(name string) error {
	fi, err := b.cfg.FS.Stat(name)
	if isNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		kids, err := b.cfg.FS.ReadDir(name)
		if err != nil {
			return err
		}
		for _, k := range kids {
			if err := b.removeAll(filepath.Join(name, k)); err != nil {
				return err
			}
		}
	}
	if err := b.cfg.FS.Remove(name); err != nil && !isNotExist(err) {
		return err
	}
	return nil
}

// Purge discards every queued (ready or delayed) message of the queue that
// was published before the purge reached its partition, on every partition
// at once, and calls done once with the number discarded after the discards
// are durable. Purged messages are not dead-lettered. Inflight messages stay
// with the consumers holding them (their settles work as usual): taking
// them away would turn every settle in flight into a stale lease and
// redeliver nothing, and a consumer that needs them gone can ack them. One
// that comes back to the queue while its partition's purge is still under
// way may be purged too. The queue is not created: CodeNotFound if it does
// not exist. A quarantined or failed partition makes done report
// CodeUnavailable; the other partitions are purged anyway. done must not
// block; it may run before Purge returns.
func (b *Broker) Purge(pq *protocol.PurgeQueue, done func(protocol.PurgeOK, error)) {
	if b.closed.Load() {
		done(protocol.PurgeOK{}, ErrShuttingDown)
		return
	}
	if err := validName("topic", pq.Topic, false); err != nil {
		done(protocol.PurgeOK{}, err)
		return
	}
	if err := validName("group", pq.Group, true); err != nil {
		done(protocol.PurgeOK{}, err)
		return
	}
	if b.cfg.Cluster != nil {
		b.purgeInCluster(pq, done)
		return
	}
	q, err := b.lookup(pq.Topic, pq.Group)
	if err != nil {
		done(protocol.PurgeOK{}, err)
		return
	}
	var (
		mu       sync.Mutex
		left     = len(q.parts)
		total    uint64
		firstErr error
	)
	for i, p := range q.parts {
		p.Purge(func(n uint64, err error) {
			mu.Lock()
			total += n
			if err != nil && firstErr == nil {
				firstErr = b.partitionError("purge", q, uint32(i), err)
			}
			left--
			last, sum, ferr := left == 0, total, firstErr
			mu.Unlock()
			if !last {
				return
			}
			if ferr != nil {
				pe := &protocol.Error{Code: protocol.CodeOf(ferr), Message: ferr.Error()}
				var e *protocol.Error
				if errors.As(ferr, &e) {
					pe.Message = e.Message
				}
				pe.Message += fmt.Sprintf(" (%d messages purged from the other partitions)", sum)
				done(protocol.PurgeOK{Purged: sum}, pe)
				return
			}
			b.logger.Info("queue purged", "topic", pq.Topic, "group", pq.Group, "purged", sum)
			done(protocol.PurgeOK{Purged: sum}, nil)
		})
	}
}

// partitionError maps a partition's refusal to what a peer may see.
func (b *Broker) partitionError(op string, q *queueEntry, idx uint32, err error) error {
	switch {
	case errors.Is(err, partition.ErrClosed) && q.deleted.Load():
		return errDeletedMeanwhile(q.key)
	case errors.Is(err, partition.ErrUnavailable):
		return unavailableError(q, idx)
	}
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe
	}
	return b.internalError(op, q.key, err, "partition", idx)
}

// checkBudget refuses the creation of queue k as m when it would pass
// Config.QueuesMax or Config.PartitionsTotalMax. Dead-letter queues (the
// global one, and targets the broker creates to hold a copy) are exempt,
// neither checked nor counted, so a dead-letter copy never fails for lack
// of budget. Callers hold createMu.
func (b *Broker) checkBudget(k queueKey, m *queueMeta) error {
	global := queueKey{b.cfg.DeadLetterTopic, ""}
	if k == global || m.DeadLetterQueue {
		return nil
	}
	n := m.Partitions
	b.mu.RLock()
	queues, parts := 0, 0
	for qk, q := range b.queues {
		if qk != global && !q.meta.Load().DeadLetterQueue {
			queues++
			parts += len(q.parts)
		}
	}
	b.mu.RUnlock()
	switch {
	case queues >= b.cfg.QueuesMax:
		return protocol.Errorf(protocol.CodeLimitExceeded,
			"cannot create queue %q group %q: the broker holds %d queues, limits.queues_max is %d",
			k.topic, k.group, queues, b.cfg.QueuesMax)
	case parts+int(n) > b.cfg.PartitionsTotalMax:
		return protocol.Errorf(protocol.CodeLimitExceeded,
			"cannot create queue %q group %q: %d partitions more than the %d held would pass limits.partitions_total_max %d",
			k.topic, k.group, n, parts, b.cfg.PartitionsTotalMax)
	}
	return nil
}

// internalError logs a failure of the broker itself with its context and
// returns what a peer may see: the code and the operation, never the cause,
// which names server paths.
func (b *Broker) internalError(op string, k queueKey, err error, attrs ...any) error {
	b.logger.Error("internal error", append([]any{"op", op, "topic", k.topic, "group", k.group, "err", err}, attrs...)...)
	return protocol.Errorf(protocol.CodeInternal, "%s of queue %q group %q failed inside the broker; the broker log has the cause",
		op, k.topic, k.group)
}

// unavailableError says which partition serves nothing and why, without
// the underlying error (it names server paths; /readyz and the log have it).
func unavailableError(q *queueEntry, idx uint32) error {
	why := "failed (a write or sync error stopped it; it serves nothing until the broker restarts)"
	if int(idx) < len(q.parts) && q.parts[idx].Quarantined() != nil {
		why = "quarantined (its log or checkpoint failed verification at startup)"
	}
	return protocol.Errorf(protocol.CodeUnavailable, "queue %q group %q partition %d is %s",
		q.key.topic, q.key.group, idx, why)
}

func errDeletedMeanwhile(k queueKey) error {
	return protocol.Errorf(protocol.CodeUnavailable, "queue %q group %q was deleted meanwhile; a retry uses a new queue",
		k.topic, k.group)
}

// Problem is a partition that serves nothing.
type Problem struct {
	Topic, Group string
	Partition    uint32
	// State is "quarantined" (damaged at Open) or "failed" (stopped by a
	// write or sync error at run time).
	State string
	// Err is the cause, for operators: it may name server paths.
	Err string
}

func (p Problem) String() string {
	return fmt.Sprintf("queue %q group %q partition %d %s: %s", p.Topic, p.Group, p.Partition, p.State, p.Err)
}

// Problems lists every partition that is quarantined or failed, ordered by
// topic, group and partition. A broker with problems still serves its other
// partitions, but is not fully ready (see /readyz).
func (b *Broker) Problems() []Problem {
	b.mu.RLock()
	var out []Problem
	for _, q := range b.queues {
		for _, p := range q.parts {
			err := p.Unavailable()
			if err == nil {
				continue
			}
			st := "failed"
			if p.Quarantined() != nil {
				st = "quarantined"
			}
			out = append(out, Problem{Topic: q.key.topic, Group: q.key.group, Partition: p.Index(), State: st, Err: err.Error()})
		}
	}
	b.mu.RUnlock()
	slices.SortFunc(out, func(a, c Problem) int {
		return cmp.Or(cmp.Compare(a.Topic, c.Topic), cmp.Compare(a.Group, c.Group), cmp.Compare(a.Partition, c.Partition))
	})
	return out
}
