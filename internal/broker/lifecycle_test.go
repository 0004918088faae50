package broker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

func queueDir(topic, group string) string {
	return filepath.Join("data", queuesDir, dirName(topic), dirName(group))
}

func exists(fs vfs.FS, name string) bool {
	_, err := fs.Stat(name)
	return err == nil
}

func purgeQueue(b *Broker, topic, group string) (uint64, error) {
	type res struct {
		ok  protocol.PurgeOK
		err error
	}
	ch := make(chan res, 1)
	b.Purge(&protocol.PurgeQueue{Topic: topic, Group: group}, func(ok protocol.PurgeOK, err error) { ch <- res{ok, err} })
	r := <-ch
	return r.ok.Purged, r.err
}

func qstats(b *Broker, topic, group string) (QueueStats, bool) {
	for _, q := range b.Stats().Queues {
		if q.Topic == topic && q.Group == group {
			return q, true
		}
	}
	return QueueStats{}, false
}

// Delete ends the queue's subscriptions with the queue-deleted reason,
// removes its files, frees its name (first use creates a new, empty queue)
// and stays deleted across a restart.
func TestDeleteQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		b := mustOpen(t, cfg)
		ctx := context.Background()
		if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "t", Group: "g", Partitions: 3, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, b, &protocol.Publish{Topic: "other", Partition: -1, Body: []byte("stays")})
		for range 9 {
			mustPublish(t, b, &protocol.Publish{Topic: "t", Group: "g", Partition: -1, Body: []byte("x")})
		}
		r := &rec{}
		if _, err := b.Subscribe(&protocol.Subscribe{Topic: "t", Group: "g", Partition: -1, Prefetch: 2}, r); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if !exists(fs, queueDir("t", "g")) {
			t.Fatal("queue directory missing before delete")
		}
		if err := b.Delete(ctx, &protocol.DeleteQueue{Topic: "t", Group: "g"}); err != nil {
			t.Fatalf("delete: %v", err)
		}
		r.mu.Lock()
		closed := append([]uint8(nil), r.closed...)
		r.mu.Unlock()
		if len(closed) != 1 || closed[0] != protocol.SubClosedQueueDeleted {
			t.Fatalf("subscription closes %v, want [queue deleted]", closed)
		}
		if _, ok := qstats(b, "t", "g"); ok {
			t.Fatal("deleted queue still in stats")
		}
		if exists(fs, queueDir("t", "g")) || exists(fs, filepath.Dir(queueDir("t", "g"))) {
			t.Fatal("deleted queue's directory is still there")
		}
		if left, _ := fs.ReadDir(filepath.Join("data", queuesDir, trashDir)); len(left) != 0 {
			t.Fatalf("trash holds %v", left)
		}
		if b.Stats().Subscriptions != 0 {
			t.Fatalf("subscriptions left: %d", b.Stats().Subscriptions)
		}
		err := b.Delete(ctx, &protocol.DeleteQueue{Topic: "t", Group: "g"})
		if protocol.CodeOf(err) != protocol.CodeNotFound {
			t.Fatalf("second delete: %v, want not_found", err)
		}
		if _, err := purgeQueue(b, "t", "g"); protocol.CodeOf(err) != protocol.CodeNotFound {
			t.Fatalf("purge of a deleted queue: %v, want not_found", err)
		}
		// First use after the delete creates a new queue with the defaults.
		mustPublish(t, b, &protocol.Publish{Topic: "t", Group: "g", Partition: -1, Body: []byte("new")})
		q, ok := qstats(b, "t", "g")
		if !ok || len(q.Partitions) != 1 || q.Partitions[0].Ready != 1 {
			t.Fatalf("recreated queue %+v", q)
		}
		if err := b.Delete(ctx, &protocol.DeleteQueue{Topic: "t", Group: "g"}); err != nil {
			t.Fatal(err)
		}
		b.Close()
		b = mustOpen(t, cfg)
		defer b.Close()
		if _, ok := qstats(b, "t", "g"); ok {
			t.Fatal("deleted queue came back after a restart")
		}
		if q, ok := qstats(b, "other", ""); !ok || q.Partitions[0].Ready != 1 {
			t.Fatalf("other queue after restart: %+v %v", q, ok)
		}
	})
}

// A confirmed delete survives a crash (only synced data survives MemFS's
// crash), and a delete interrupted between the rename and the removal is
// finished at the next start instead of bringing part of the queue back.
func TestDeleteCrashSafe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		fs := vfs.NewMem()
		// The data dir itself is the operator's; make it durable as they would.
		if err := fs.MkdirAll("data", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := fs.SyncDir("."); err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(fs)
		b := mustOpen(t, cfg)
		for _, topic := range []string{"gone", "half", "kept"} {
			for range 5 {
				mustPublish(t, b, msg(topic, "x"))
			}
		}
		// Another group of the same topic keeps the topic directory, so
		// only the directory syncs make the delete durable.
		mustPublish(t, b, &protocol.Publish{Topic: "gone", Group: "g", Partition: -1, Body: []byte("x")})
		if err := b.Delete(context.Background(), &protocol.DeleteQueue{Topic: "gone", Group: "g"}); err != nil {
			t.Fatal(err)
		}
		crashed := fs.Crash(rng, true)
		b.Close() // the crashed FS refuses everything; only the clone matters

		b = mustOpen(t, testConfig(crashed))
		if _, ok := qstats(b, "gone", "g"); ok {
			t.Fatal("confirmed delete undone by a crash")
		}
		for _, topic := range []string{"gone", "half", "kept"} {
			if q, ok := qstats(b, topic, ""); !ok || q.Partitions[0].Ready != 5 {
				t.Fatalf("queue %s after crash: %+v %v", topic, q, ok)
			}
		}
		b.Close()

		// Interrupt a delete after its rename: the queue sits in the trash
		// with its files.
		tr := filepath.Join("data", queuesDir, trashDir)
		if err := crashed.MkdirAll(tr, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := crashed.Rename(queueDir("half", ""), filepath.Join(tr, "x-1")); err != nil {
			t.Fatal(err)
		}
		if err := syncDirs(crashed, filepath.Dir(queueDir("half", "")), tr, filepath.Join("data", queuesDir)); err != nil {
			t.Fatal(err)
		}
		b = mustOpen(t, testConfig(crashed))
		defer b.Close()
		if _, ok := qstats(b, "half", ""); ok {
			t.Fatal("half-deleted queue came back")
		}
		if left, _ := crashed.ReadDir(tr); len(left) != 0 {
			t.Fatalf("trash not emptied at Open: %v", left)
		}
		if q, ok := qstats(b, "kept", ""); !ok || q.Partitions[0].Ready != 5 {
			t.Fatalf("kept queue: %+v %v", q, ok)
		}
	})
}

// Purge discards ready and delayed messages on every partition, durably and
// without dead-letter copies, reports how many, and leaves inflight
// messages with their consumer.
func TestPurgeQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		b := mustOpen(t, cfg)
		ctx := context.Background()
		if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "t", Partitions: 2, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		for range 10 {
			mustPublish(t, b, msg("t", "x"))
		}
		p := msg("t", "later")
		p.DelayMs = 3_600_000
		mustPublish(t, b, p)
		r := &rec{}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "t", Partition: -1, Prefetch: 3}, r)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		held := r.deliveries()
		if len(held) != 3 {
			t.Fatalf("holding %d, want 3", len(held))
		}
		n, err := purgeQueue(b, "t", "")
		if err != nil || n != 11-3 {
			t.Fatalf("purge: %d %v, want 8", n, err)
		}
		synctest.Wait()
		q, _ := qstats(b, "t", "")
		ready, delayed, inflight := 0, 0, 0
		for _, ps := range q.Partitions {
			ready, delayed, inflight = ready+ps.Ready, delayed+ps.Delayed, inflight+ps.Inflight
		}
		if ready+delayed != 0 || inflight != 3 {
			t.Fatalf("after purge: ready %d delayed %d inflight %d", ready, delayed, inflight)
		}
		if _, ok := qstats(b, DeadLetterTopicDefault, ""); ok {
			t.Fatal("purge created dead-letter copies")
		}
		if code := r.settle(s, protocol.OpAck, held[0]); code != protocol.CodeOK {
			t.Fatalf("ack of a held message after purge: %v", code)
		}
		if n, err := purgeQueue(b, "t", ""); err != nil || n != 0 {
			t.Fatalf("purge of an empty queue: %d %v", n, err)
		}
		if _, err := purgeQueue(b, "nope", ""); protocol.CodeOf(err) != protocol.CodeNotFound {
			t.Fatalf("purge of a missing queue: %v", err)
		}
		if _, ok := qstats(b, "nope", ""); ok {
			t.Fatal("purge created a queue")
		}
		s.Close()
		b.Close()
		// Durable: after a restart only the two released leases are ready.
		b = mustOpen(t, cfg)
		defer b.Close()
		q, _ = qstats(b, "t", "")
		ready = 0
		for _, ps := range q.Partitions {
			ready += ps.Ready + ps.Delayed + ps.Inflight
		}
		if ready != 2 {
			t.Fatalf("after restart %d messages left, want the 2 released ones", ready)
		}
	})
}

// Creation stays within the budget: each limit is limit_exceeded naming
// it, the global dead-letter queue is exempt, and a delete frees room.
func TestCreationBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(vfs.NewMem())
		cfg.QueuesMax, cfg.QueuePartitionsMax, cfg.PartitionsTotalMax = 3, 4, 5
		b := mustOpen(t, cfg)
		defer b.Close()
		ctx := context.Background()
		limit := func(err error, name string) {
			t.Helper()
			if protocol.CodeOf(err) != protocol.CodeLimitExceeded || !strings.Contains(err.Error(), name) {
				t.Fatalf("got %v, want limit_exceeded naming %s", err, name)
			}
		}
		_, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "big", Partitions: 5, MaxRetries: -1})
		limit(err, "limits.queue_partitions_max")
		if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "a", Partitions: 4, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		_, err = b.Declare(ctx, &protocol.DeclareQueue{Topic: "b", Partitions: 3, MaxRetries: -1})
		limit(err, "limits.partitions_total_max")
		mustPublish(t, b, msg("b", "poison")) // first use: 1 partition, 5 in total
		_, err = publish(t, b, msg("c", "x"))
		limit(err, "limits.partitions_total_max")
		_, err = b.Subscribe(&protocol.Subscribe{Topic: "c", Partition: -1}, &rec{})
		limit(err, "limits.partitions_total_max")

		// The dead-letter queue is created with the budget spent.
		r := &rec{}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "b", Partition: -1, Prefetch: 1}, r)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if code := r.settle(s, protocol.OpFail, r.deliveries()[0]); code != protocol.CodeOK {
			t.Fatal(code)
		}
		synctest.Wait()
		if q, ok := qstats(b, DeadLetterTopicDefault, ""); !ok || q.Partitions[0].Ready != 1 {
			t.Fatalf("dead-letter queue: %+v %v", q, ok)
		}

		// Deleting frees room; then the queue count is the limit.
		if err := b.Delete(ctx, &protocol.DeleteQueue{Topic: "a"}); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, b, msg("c", "x"))
		mustPublish(t, b, msg("d", "x"))
		_, err = publish(t, b, msg("e", "x"))
		limit(err, "limits.queues_max")
		if n := len(b.Stats().Queues); n != 4 { // b, c, d and the dead-letter queue
			t.Fatalf("%d queues: %+v", n, b.Stats().Queues)
		}
	})
}

// Every valid name fits the file system: a 255-byte name whose escaped
// form is three times longer works, survives a restart and does not share
// a directory with a name that differs only at its end.
func TestLongNamesFitTheFileSystem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		b := mustOpen(t, cfg)
		long1 := strings.Repeat("ü", 127) + "a" // 255 bytes, escapes to 763
		long2 := strings.Repeat("ü", 127) + "b"
		ascii := strings.Repeat("x", NameBytesMax)
		for _, topic := range []string{long1, long2, ascii} {
			for _, d := range []string{dirName(topic), dirName(long1 + "")} {
				if len(d) > fileNameBytesMax {
					t.Fatalf("dirName is %d bytes", len(d))
				}
			}
			mustPublish(t, b, &protocol.Publish{Topic: topic, Group: long2, Partition: -1, Body: []byte(topic[len(topic)-1:])})
		}
		if dirName(long1) == dirName(long2) {
			t.Fatal("two long names share a directory")
		}
		b.Close()
		b = mustOpen(t, cfg)
		defer b.Close()
		for _, topic := range []string{long1, long2, ascii} {
			q, ok := qstats(b, topic, long2)
			if !ok || q.Partitions[0].Ready != 1 {
				t.Fatalf("long-named queue after restart: %+v %v", q, ok)
			}
		}
		if err := b.Delete(context.Background(), &protocol.DeleteQueue{Topic: long1, Group: long2}); err != nil {
			t.Fatal(err)
		}
	})
}

// lockedBuffer collects log output from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A failure inside the broker reaches the peer as internal without the
// server's paths, and the log has the cause with its context.
func TestInternalErrorsAreLoggedNotLeaked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		var logs lockedBuffer
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		b := mustOpen(t, cfg)
		defer b.Close()
		fs.SetWriteError(errors.New("no space left on device"))
		_, err := publish(t, b, msg("fresh", "x"))
		fs.SetWriteError(nil)
		if protocol.CodeOf(err) != protocol.CodeInternal {
			t.Fatalf("publish with a failing disk: %v, want internal", err)
		}
		if strings.Contains(err.Error(), "data/") || strings.Contains(err.Error(), "no space") {
			t.Fatalf("error sent to the peer leaks the cause: %v", err)
		}
		out := logs.String()
		for _, want := range []string{"op=\"create queue\"", "topic=fresh", "no space left on device", "data/"} {
			if !strings.Contains(out, want) {
				t.Fatalf("log lacks %q:\n%s", want, out)
			}
		}
		// The failed creation left nothing half made that blocks a retry.
		mustPublish(t, b, msg("fresh", "x"))
	})
}

// A partition that failed at run time refuses new subscriptions at once
// with unavailable, tells its subscribers which partition failed without
// the cause, and is listed by Problems.
func TestSubscribeToFailedPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		b := mustOpen(t, testConfig(fs))
		defer b.Close()
		if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "t", Partitions: 1, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		r := &closeRec{}
		if _, err := b.Subscribe(&protocol.Subscribe{Topic: "t", Partition: -1}, r); err != nil {
			t.Fatal(err)
		}
		fs.SetSyncError(errors.New("disk on fire at /srv/sinew"))
		_, err := publish(t, b, msg("t", "x"))
		fs.SetSyncError(nil)
		if protocol.CodeOf(err) != protocol.CodeUnavailable {
			t.Fatalf("publish with a failing fsync: %v", err)
		}
		synctest.Wait()
		if r.reason != protocol.SubClosedError || protocol.CodeOf(r.err) != protocol.CodeUnavailable ||
			!strings.Contains(r.err.Error(), "partition 0") || strings.Contains(r.err.Error(), "/srv") {
			t.Fatalf("subscriber told %d %v", r.reason, r.err)
		}
		for _, part := range []int32{0, -1} {
			_, err := b.Subscribe(&protocol.Subscribe{Topic: "t", Partition: part}, &rec{})
			if protocol.CodeOf(err) != protocol.CodeUnavailable || strings.Contains(err.Error(), "/srv") {
				t.Fatalf("subscribe to partition %d of a failed queue: %v", part, err)
			}
		}
		ps := b.Problems()
		if len(ps) != 1 || ps[0].State != "failed" || !strings.Contains(ps[0].Err, "disk on fire") {
			t.Fatalf("problems %+v", ps)
		}
		if b.Stats().Subscriptions != 0 {
			t.Fatalf("subscriptions left: %d", b.Stats().Subscriptions)
		}
	})
}

type closeRec struct {
	rec
	reason uint8
	err    error
}

func (c *closeRec) Closed(s *Subscription, reason uint8, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reason, c.err = reason, err
}

// Publishes, subscribes and purges racing a delete all get an answer (a
// deadlock fails the synctest bubble), and only the codes a delete may
// cause: ok (before it, or on the new queue after it), unavailable, or
// not_found.
func TestDeleteRacesUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		ctx := context.Background()
		allowed := func(err error) bool {
			switch protocol.CodeOf(err) {
			case protocol.CodeOK, protocol.CodeUnavailable, protocol.CodeNotFound:
				return true
			}
			return false
		}
		for round := range 5 {
			if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "t", Partitions: 2, MaxRetries: 0}); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 1000)
			for range 4 {
				wg.Go(func() {
					for range 20 {
						_, err := publish(t, b, msg("t", "x"))
						errs <- err
					}
				})
			}
			wg.Go(func() {
				for range 10 {
					s, err := b.Subscribe(&protocol.Subscribe{Topic: "t", Partition: -1, Prefetch: 5}, &rec{})
					errs <- err
					if err == nil && round%2 == 0 {
						s.Close()
					}
				}
			})
			wg.Go(func() { _, err := purgeQueue(b, "t", ""); errs <- err })
			wg.Go(func() { errs <- b.Delete(ctx, &protocol.DeleteQueue{Topic: "t"}) })
			wg.Wait()
			close(errs)
			for err := range errs {
				if !allowed(err) {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			// Whatever the race left (a queue recreated by a late
			// publish, or nothing) can be deleted.
			if err := b.Delete(ctx, &protocol.DeleteQueue{Topic: "t"}); err != nil && protocol.CodeOf(err) != protocol.CodeNotFound {
				t.Fatal(err)
			}
		}
	})
}

// A queue with a quarantined partition: a purge empties the healthy
// partitions and reports unavailable with their count; deleting the queue
// removes the damaged data too and clears the problem.
func TestPurgeAndDeleteWithQuarantinedPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		b := mustOpen(t, cfg)
		if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "t", Partitions: 2, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			p := msg("t", "x")
			p.Partition = int32(i % 2)
			mustPublish(t, b, p)
		}
		b.Close()
		pdir := filepath.Join(queueDir("t", ""), "p0")
		fs.Remove(filepath.Join(pdir, "checkpoint"))
		if err := fs.FlipBit(filepath.Join(pdir, "log", seglog.SegmentName(1)), 20, 1); err != nil {
			t.Fatal(err)
		}
		b = mustOpen(t, cfg)
		defer b.Close()
		if len(b.Problems()) != 1 {
			t.Fatalf("problems %+v", b.Problems())
		}
		n, err := purgeQueue(b, "t", "")
		if protocol.CodeOf(err) != protocol.CodeUnavailable || n != 3 ||
			!strings.Contains(err.Error(), "partition 0 is quarantined") || !strings.Contains(err.Error(), "3 messages purged") {
			t.Fatalf("purge: %d %v", n, err)
		}
		if err := b.Delete(context.Background(), &protocol.DeleteQueue{Topic: "t"}); err != nil {
			t.Fatal(err)
		}
		if ps := b.Problems(); len(ps) != 0 {
			t.Fatalf("problems after deleting the damaged queue: %+v", ps)
		}
		if exists(fs, queueDir("t", "")) {
			t.Fatal("damaged queue's files are still there")
		}
	})
}

// A queue's named dead-letter target is created even with the budget
// spent, and does not count against it.
func TestNamedDeadLetterTargetIsExempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(vfs.NewMem())
		cfg.QueuesMax = 1
		b := mustOpen(t, cfg)
		defer b.Close()
		ctx := context.Background()
		if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "src", MaxRetries: -1,
			DeadLetterMode: protocol.DeadLetterQueue, DeadLetterTarget: "src.dlq"}); err != nil {
			t.Fatal(err)
		}
		r := &rec{}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "src", Partition: -1, Prefetch: 1}, r)
		if err != nil {
			t.Fatal(err)
		}
		mustPublish(t, b, msg("src", "poison"))
		synctest.Wait()
		if code := r.settle(s, protocol.OpFail, r.deliveries()[0]); code != protocol.CodeOK {
			t.Fatal(code)
		}
		synctest.Wait()
		if q, ok := qstats(b, "src.dlq", ""); !ok || q.Partitions[0].Ready != 1 {
			t.Fatalf("named dead-letter queue: %+v %v", q, ok)
		}
		if _, err := publish(t, b, msg("other", "x")); protocol.CodeOf(err) != protocol.CodeLimitExceeded {
			t.Fatalf("second peer queue: %v, want limit_exceeded", err)
		}
	})
}

// When one partition of a subscription fails, the subscription ends, but its
// leases on the partitions still serving are not handed to a competing
// consumer at once: its client has not read the SUB_CLOSED yet and may still
// be reading those deliveries. Released at once, a message could go to the
// competitor, be ACKed ok there, and then reach the first client, whose late
// ACK is stale: a message delivered after an ACK of it was answered ok (the
// chaos test TestDiskFull caught this). Kept, the late ACK settles it; a
// lease left unsettled goes back to the queue after endedSubLeaseKeepMs.
func TestFailedPartitionKeepsLeasesOnTheOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &dirSyncFS{FS: vfs.NewMem(), dir: "/p1/"}
		b := mustOpen(t, testConfig(fs))
		defer b.Close()
		if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "t", Partitions: 2, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		a := &closeRec{}
		sa, err := b.Subscribe(&protocol.Subscribe{Topic: "t", Partition: -1, Prefetch: 10}, a)
		if err != nil {
			t.Fatal(err)
		}
		for _, body := range []string{"x1", "x2"} {
			mustPublish(t, b, &protocol.Publish{Topic: "t", Partition: 0, Body: []byte(body)})
		}
		synctest.Wait()
		held := a.deliveries()
		if len(held) != 2 {
			t.Fatalf("a got %d deliveries, want 2", len(held))
		}
		c := &rec{}
		sc, err := b.Subscribe(&protocol.Subscribe{Topic: "t", Partition: 0, Prefetch: 10}, c)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()

		// Partition 1 fails (partition 0 writes on): a's subscription
		// ends. Its store writes in the background, the node journal
		// having made the record durable, so the failure surfaces at the
		// write after the first one, within a write interval.
		fs.failing.Store(true)
		_, err = publish(t, b, &protocol.Publish{Topic: "t", Partition: 1, Body: []byte("y")})
		if err == nil {
			time.Sleep(2 * time.Second)
			synctest.Wait()
			_, err = publish(t, b, &protocol.Publish{Topic: "t", Partition: 1, Body: []byte("z")})
		}
		if protocol.CodeOf(err) != protocol.CodeUnavailable {
			t.Fatalf("publish with failing writes: %v", err)
		}
		synctest.Wait()
		if a.reason != protocol.SubClosedError {
			t.Fatalf("a's subscription: closed with reason %d, want %d", a.reason, protocol.SubClosedError)
		}
		if got := c.deliveries(); len(got) != 0 {
			t.Fatalf("c got %d of a's leased messages as soon as a's subscription ended", len(got))
		}
		// a's client reads x1 late and ACKs it: the lease is still its own.
		if code := a.settle(sa, protocol.OpAck, held[0]); code != protocol.CodeOK {
			t.Fatalf("late ACK of a kept lease: %v", code)
		}
		synctest.Wait()
		if got := c.deliveries(); len(got) != 0 {
			t.Fatalf("c got %+v before the keep ended", got)
		}

		// x2 was never settled: it comes back once the keep ends, as a
		// release, and x1 never does.
		time.Sleep(endedSubLeaseKeepMs * time.Millisecond)
		synctest.Wait()
		got := c.deliveries()
		if len(got) != 1 || got[0].Offset != held[1].Offset || got[0].Attempt != 2 {
			t.Fatalf("after the keep c got %+v, want offset %d attempt 2", got, held[1].Offset)
		}
		if code := c.settle(sc, protocol.OpAck, got[0]); code != protocol.CodeOK {
			t.Fatalf("ack by c: %v", code)
		}
		if code := a.settle(sa, protocol.OpAck, held[1]); code != protocol.CodeStaleLease {
			t.Fatalf("a's ACK after its lease was released and the message acked by c: %v", code)
		}
	})
}

// dirSyncFS fails File.Sync of the files whose name contains dir while
// failing is set (a full disk that only one partition notices).
type dirSyncFS struct {
	vfs.FS
	dir     string
	failing atomic.Bool
}

func (f *dirSyncFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil || !strings.Contains(filepath.ToSlash(name), f.dir) {
		return file, err
	}
	return &dirSyncFile{File: file, fs: f}, nil
}

type dirSyncFile struct {
	vfs.File
	fs *dirSyncFS
}

func (f *dirSyncFile) Sync() error {
	if f.fs.failing.Load() {
		return errors.New("no space left on device")
	}
	return f.File.Sync()
}

// Writes fail too: through the node journal a publish is made durable by
// the journal's fsync, and the partition's own files see the failure when
// the record is written to them.
func (f *dirSyncFile) Write(p []byte) (int, error) {
	if f.fs.failing.Load() {
		return 0, errors.New("no space left on device")
	}
	return f.File.Write(p)
}

func (f *dirSyncFile) WriteAt(p []byte, off int64) (int, error) {
	if f.fs.failing.Load() {
		return 0, errors.New("no space left on device")
	}
	return f.File.WriteAt(p, off)
}
