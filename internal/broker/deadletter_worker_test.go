package broker

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// partitionStats returns partition 0's counters of topic's default group.
func partitionStats(t *testing.T, b *Broker, topic string) PartitionStats {
	t.Helper()
	qs, err := b.QueueStatsOf(topic, "")
	if err != nil {
		t.Fatal(err)
	}
	return qs.Partitions[0]
}

// TestDeadLetterCreationDoesNotBlockPartition: while the first dead letter's
// target queue is being created (held up here by a hook, as a controller's
// commit may be for seconds), the source partition keeps confirming
// publishes and delivering; once the creation finishes, the copy lands in
// the target and only then leaves the source.
func TestDeadLetterCreationDoesNotBlockPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		creating := make(chan string, 1)
		release := make(chan struct{})
		b.testCreateHook = func(topic string) {
			creating <- topic
			<-release
		}
		released := false
		defer func() {
			if !released {
				close(release)
			}
		}()
		if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "src", Partitions: 1, MaxRetries: 1}); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, b, msg("src", "bad"))
		r := &rec{}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "src", Partition: -1, Prefetch: 10}, r)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		got := r.deliveries()
		if len(got) != 1 {
			t.Fatalf("first delivery: %+v", got)
		}
		failed := make(chan protocol.Code, 1)
		s.Settle(protocol.OpFail, got[0].Partition, got[0].Offset, got[0].LeaseID, 0, func(c protocol.Code) { failed <- c })
		synctest.Wait()
		select {
		case topic := <-creating:
			if topic != DeadLetterTopicDefault {
				t.Fatalf("creating %q, want %q", topic, DeadLetterTopicDefault)
			}
		default:
			t.Fatal("the dead letter did not start creating its target")
		}
		// The target's creation is stuck; the source partition serves on.
		published := make(chan error, 1)
		b.Publish(msg("src", "good"), func(_ protocol.PublishOK, err error) { published <- err })
		synctest.Wait()
		select {
		case code := <-failed:
			if code != protocol.CodeOK {
				t.Fatalf("fail: %v", code)
			}
		default:
			t.Fatal("the FAIL was not answered while the dead-letter queue was being created")
		}
		select {
		case err := <-published:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("a publish was not confirmed while the dead-letter queue was being created")
		}
		got = r.deliveries()
		if len(got) != 2 || string(got[1].Body) != "good" {
			t.Fatalf("deliveries while the dead-letter queue was being created: %+v", got)
		}
		if st := partitionStats(t, b, "src"); st.DeadLettering != 1 {
			t.Fatalf("source before the copy is confirmed: %d dead-lettering, want 1", st.DeadLettering)
		}
		released = true
		close(release)
		synctest.Wait()
		if st := partitionStats(t, b, "src"); st.DeadLettering != 0 {
			t.Fatalf("source after the copy is confirmed: %d dead-lettering, want 0", st.DeadLettering)
		}
		if st := partitionStats(t, b, DeadLetterTopicDefault); st.Ready != 1 {
			t.Fatalf("dead-letter queue: %d ready, want 1", st.Ready)
		}
	})
}

// TestDeadLetterWorkerFullRefuses: with the worker's queue full a copy is
// refused at once (the partition retries it later), and after Close every
// copy is refused; none is lost silently.
func TestDeadLetterWorkerFullRefuses(t *testing.T) {
	w := newDeadLetterWorker(deadLetterJobsMax)
	for range deadLetterJobsMax {
		if err := w.enqueue(deadLetterJob{done: func(error) { t.Error("done called for a queued job") }}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.enqueue(deadLetterJob{}); err != errDeadLetterBusy {
		t.Fatalf("enqueue on a full queue: %v, want errDeadLetterBusy", err)
	}
	answered := 0
	for range deadLetterJobsMax {
		<-w.jobs
	}
	for range 3 {
		if err := w.enqueue(deadLetterJob{done: func(err error) {
			if err != ErrShuttingDown {
				t.Errorf("queued job answered %v at stop", err)
			}
			answered++
		}}); err != nil {
			t.Fatal(err)
		}
	}
	w.stop()
	if answered != 3 {
		t.Fatalf("%d of 3 queued jobs answered at stop", answered)
	}
	if err := w.enqueue(deadLetterJob{}); err != ErrShuttingDown {
		t.Fatalf("enqueue after stop: %v", err)
	}
}

// TestDeadLetterWorkerFullRetries: copies the worker has no room for stay
// dead-lettering in their source and are copied later; none is lost, and
// each lands in the dead-letter queue once.
func TestDeadLetterWorkerFullRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(vfs.NewMem())
		cfg.deadLetterJobsMax = 1
		logs := &syncBuffer{}
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
		b := mustOpen(t, cfg)
		defer b.Close()
		release := make(chan struct{})
		b.testCreateHook = func(string) { <-release }
		released := false
		defer func() {
			if !released {
				close(release)
			}
		}()
		const n = 5
		for i := range n {
			mustPublish(t, b, msg("src", strconv.Itoa(i)))
		}
		r := &rec{}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "src", Partition: -1, Prefetch: n}, r)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		for _, d := range r.deliveries() {
			if code := r.settle(s, protocol.OpFail, d); code != protocol.CodeOK {
				t.Fatal(code)
			}
		}
		synctest.Wait()
		// One copy is in the worker's hands (creating the queue), one
		// waits in its queue, the rest were refused and wait in the source.
		if st := partitionStats(t, b, "src"); st.DeadLettering != n {
			t.Fatalf("source: %d dead-lettering, want %d", st.DeadLettering, n)
		}
		if !strings.Contains(logs.String(), "dead-letter queue of work is full") {
			t.Fatalf("no copy was refused for a full worker queue; log:\n%s", logs)
		}
		released = true
		close(release)
		for range 10 {
			time.Sleep(time.Second) // the source's retry delay
			synctest.Wait()
			if partitionStats(t, b, "src").DeadLettering == 0 {
				break
			}
		}
		if st := partitionStats(t, b, "src"); st.DeadLettering != 0 {
			t.Fatalf("source after retries: %d dead-lettering, want 0", st.DeadLettering)
		}
		if st := partitionStats(t, b, DeadLetterTopicDefault); st.Ready != n {
			t.Fatalf("dead-letter queue: %d ready, want %d", st.Ready, n)
		}
	})
}
