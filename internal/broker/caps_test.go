package broker

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

func TestSchedulingCaps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		const capMs = DelayMsMaxDefault
		now := time.Now().UnixMilli()
		refused := []struct {
			name string
			p    *protocol.Publish
			want string
		}{
			{"delay", &protocol.Publish{Topic: "t", Partition: -1, DelayMs: capMs + 1}, "maximum delay of 2592000000 ms (30 days)"},
			{"not_before", &protocol.Publish{Topic: "t", Partition: -1, NotBeforeMs: now + capMs + 1}, "maximum delay of 2592000000 ms (30 days)"},
			{"ttl", &protocol.Publish{Topic: "t", Partition: -1, TTLMs: TTLMsMaxDefault + 1}, "maximum TTL of 2592000000 ms (30 days)"},
		}
		for _, c := range refused {
			_, err := publish(t, b, c.p)
			if protocol.CodeOf(err) != protocol.CodeBadRequest || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s beyond the cap: %v, want bad_request naming %q", c.name, err, c.want)
			}
		}
		if st := b.Stats(); len(st.Queues) != 0 {
			t.Fatalf("refused publishes created a queue: %+v", st.Queues)
		}
		_, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "t", MaxRetries: -1, DefaultTTLMs: TTLMsMaxDefault + 1})
		if protocol.CodeOf(err) != protocol.CodeBadRequest || !strings.Contains(err.Error(), "maximum TTL") {
			t.Fatalf("declare with default_ttl_ms beyond the cap: %v", err)
		}
		// At the caps everything is accepted.
		for _, p := range []*protocol.Publish{
			{Topic: "t", Partition: -1, DelayMs: capMs},
			{Topic: "t", Partition: -1, NotBeforeMs: now + capMs},
			{Topic: "t", Partition: -1, TTLMs: TTLMsMaxDefault},
		} {
			if _, err := publish(t, b, p); err != nil {
				t.Fatalf("publish at the cap %+v: %v", p, err)
			}
		}
		if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "t", MaxRetries: -1, DefaultTTLMs: TTLMsMaxDefault}); err != nil {
			t.Fatalf("declare at the cap: %v", err)
		}
	})
}

// TestNackDelayCap: a NACK beyond the cap is refused with bad_request and
// leaves the lease held, so the same delivery can be settled again.
func TestNackDelayCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(vfs.NewMem())
		cfg.NackDelayMsMax = 60_000
		b := mustOpen(t, cfg)
		defer b.Close()
		mustPublish(t, b, msg("t", "x"))
		r := &rec{}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "t", Partition: -1, Prefetch: 1}, r)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		d := r.deliveries()[0]
		nack := func(delayMs int64) protocol.Code {
			ch := make(chan protocol.Code, 1)
			s.Settle(protocol.OpNack, d.Partition, d.Offset, d.LeaseID, delayMs, func(c protocol.Code) { ch <- c })
			return <-ch
		}
		if code := nack(60_001); code != protocol.CodeBadRequest {
			t.Fatalf("nack beyond the cap: %v, want bad_request", code)
		}
		st := b.Stats().Queues[0].Partitions[0]
		if st.Inflight != 1 {
			t.Fatalf("after a refused nack: %+v, want the lease still held", st)
		}
		if code := nack(60_000); code != protocol.CodeOK {
			t.Fatalf("nack at the cap: %v", code)
		}
		synctest.Wait()
		if st := b.Stats().Queues[0].Partitions[0]; st.Delayed != 1 || st.Inflight != 0 {
			t.Fatalf("after a nack at the cap: %+v, want one delayed message", st)
		}
	})
}

func TestCapsConfig(t *testing.T) {
	c := Config{DelayMsMax: -1, TTLMsMax: 5, NackDelayMsMax: TimeCapMsMax + 1}
	c.normalize()
	if c.DelayMsMax != DelayMsMaxDefault || c.TTLMsMax != 5 || c.NackDelayMsMax != TimeCapMsMax {
		t.Fatalf("normalized caps %d %d %d", c.DelayMsMax, c.TTLMsMax, c.NackDelayMsMax)
	}
	for ms, want := range map[int64]string{24 * 3600 * 1000: "1 day", DelayMsMaxDefault: "30 days", 36 * 3600 * 1000: "1.5 days"} {
		if got := days(ms); got != want {
			t.Errorf("days(%d) = %q, want %q", ms, got, want)
		}
	}
}
