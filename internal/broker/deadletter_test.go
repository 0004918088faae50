package broker

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

func TestDeclareSelfDeadLetterRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		ctx := context.Background()
		for _, d := range []*protocol.DeclareQueue{
			{Topic: "orders", MaxRetries: -1, DeadLetterMode: protocol.DeadLetterQueue, DeadLetterTarget: "orders"},
			{Topic: DeadLetterTopicDefault, MaxRetries: -1, DeadLetterMode: protocol.DeadLetterGlobal},
			{Topic: DeadLetterTopicDefault, MaxRetries: -1, DeadLetterMode: protocol.DeadLetterQueue, DeadLetterTarget: DeadLetterTopicDefault},
		} {
			_, err := b.Declare(ctx, d)
			if protocol.CodeOf(err) != protocol.CodeBadRequest || !strings.Contains(err.Error(), "itself") {
				t.Errorf("declare %q mode %d target %q: %v, want bad_request naming the loop", d.Topic, d.DeadLetterMode, d.DeadLetterTarget, err)
			}
		}
		if st := b.Stats(); len(st.Queues) != 0 {
			t.Fatalf("refused declarations created queues: %+v", st.Queues)
		}
		for _, d := range []*protocol.DeclareQueue{
			// A group's target is the topic's default group: another queue.
			{Topic: "orders", Group: "billing", MaxRetries: -1, DeadLetterMode: protocol.DeadLetterQueue, DeadLetterTarget: "orders"},
			// The default mode on the global dead-letter queue means keep.
			{Topic: DeadLetterTopicDefault, MaxRetries: -1},
		} {
			if _, err := b.Declare(ctx, d); err != nil {
				t.Errorf("declare %q/%q: %v", d.Topic, d.Group, err)
			}
		}
	})
}

// abuse subscribes to topic and, rounds times, settles every delivery
// with one of NACK, FAIL, or nothing at all (closing the subscription, so
// the leases are released), then reports the unsettled count and the
// highest attempt seen.
func abuse(t *testing.T, b *Broker, topic string, rounds int) (unsettled int, attemptMax uint32) {
	t.Helper()
	for round := range rounds {
		r := &rec{}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: topic, Partition: -1, Prefetch: 100}, r)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		for _, d := range r.deliveries() {
			attemptMax = max(attemptMax, d.Attempt)
			switch round % 3 {
			case 0:
				r.settle(s, protocol.OpNack, d)
			case 1:
				r.settle(s, protocol.OpFail, d)
			}
		}
		s.Close()
		synctest.Wait()
	}
	for _, q := range b.Stats().Queues {
		if q.Topic == topic && q.Group == "" {
			for _, p := range q.Partitions {
				unsettled += p.Ready + p.Delayed + p.Inflight + p.DeadLettering
			}
		}
	}
	return unsettled, attemptMax
}

// TestNamedDeadLetterQueueKeeps: a named target created by the first dead
// letter is a dead-letter queue, durably: NACKs, FAILs and walk-aways
// beyond any retry limit lose nothing, before and after a restart.
func TestNamedDeadLetterQueueKeeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		b := mustOpen(t, testConfig(fs))
		ctx := context.Background()
		if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "src", MaxRetries: 0,
			DeadLetterMode: protocol.DeadLetterQueue, DeadLetterTarget: "dlx"}); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			mustPublish(t, b, msg("src", "bad"))
		}
		r := &rec{}
		s, _ := b.Subscribe(&protocol.Subscribe{Topic: "src", Partition: -1, Prefetch: 10}, r)
		synctest.Wait()
		for _, d := range r.deliveries() {
			if code := r.settle(s, protocol.OpNack, d); code != protocol.CodeOK {
				t.Fatal(code)
			}
		}
		s.Close()
		synctest.Wait()
		q, err := b.lookup("dlx", "")
		if err != nil {
			t.Fatal(err)
		}
		if !q.meta.Load().DeadLetterQueue {
			t.Fatalf("dlx created without the dead-letter flag: %+v", q.meta.Load())
		}
		if n, at := abuse(t, b, "dlx", 9); n != 3 || at < 6 {
			t.Fatalf("dlx after 9 rounds: %d unsettled (want 3), highest attempt %d", n, at)
		}
		// A re-declaration cannot turn the flag off.
		if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "dlx", MaxRetries: 1}); err != nil {
			t.Fatal(err)
		}
		b.Close()

		b = mustOpen(t, testConfig(fs))
		defer b.Close()
		if n, at := abuse(t, b, "dlx", 9); n != 3 || at < 12 {
			t.Fatalf("dlx after a restart and 9 more rounds: %d unsettled (want 3), highest attempt %d", n, at)
		}
	})
}

// syncBuffer is a log sink for handlers that may write from any goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestLegacyMetadataKeeps: metadata written before these rules (a global
// dead-letter queue with max_retries 5, a queue whose policy points into
// itself, both of which used to discard) keeps every message after an
// upgrade, and the broker says so in its log.
func TestLegacyMetadataKeeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		for _, m := range []*queueMeta{
			{Version: metaVersion, Topic: DeadLetterTopicDefault, Partitions: 1, LeaseMs: 10_000, MaxRetries: 5},
			{Version: metaVersion, Topic: "loop", Partitions: 1, LeaseMs: 10_000, MaxRetries: 0,
				DeadLetterMode: protocol.DeadLetterQueue, DeadLetterTarget: "loop"},
		} {
			dir := filepath.Join("data", queuesDir, escapeName(m.Topic), escapeName(m.Group))
			if err := fs.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := writeMeta(fs, filepath.Join(dir, metaFile), m); err != nil {
				t.Fatal(err)
			}
		}
		logs := &syncBuffer{}
		cfg := testConfig(fs)
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
		b := mustOpen(t, cfg)
		defer b.Close()
		for _, topic := range []string{DeadLetterTopicDefault, "loop"} {
			p := msg(topic, "keep me")
			p.TTLMs = 50
			mustPublish(t, b, p)
			mustPublish(t, b, msg(topic, "keep me too"))
		}
		// Past the TTL: not enforced in a queue that keeps.
		time.Sleep(100 * time.Millisecond)
		for _, topic := range []string{DeadLetterTopicDefault, "loop"} {
			if n, at := abuse(t, b, topic, 9); n != 2 || at < 6 {
				t.Errorf("%s after 9 rounds: %d unsettled (want 2), highest attempt %d", topic, n, at)
			}
		}
		out := logs.String()
		for _, want := range []string{"points into itself", "dead-letter queue keeps every message"} {
			if !strings.Contains(out, want) {
				t.Errorf("log lacks %q:\n%s", want, out)
			}
		}
	})
}
