package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/benchkit"
)

// fakeBenchBroker confirms every publish after one fake millisecond and delivers
// in order; it stands in for a broker so the command's wiring can be tested
// without one.
type fakeBenchBroker struct {
	mu      sync.Mutex
	qs      map[string]chan []byte
	removed []string
}

// Remove deletes topic, as sinewadapter.Broker.Remove does on a broker.
func (f *fakeBenchBroker) Remove(_ context.Context, topic string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.qs, topic)
	f.removed = append(f.removed, topic)
	return nil
}

func (f *fakeBenchBroker) Name() string { return "fake" }

func (f *fakeBenchBroker) Prepare(_ context.Context, topic string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.qs == nil {
		f.qs = map[string]chan []byte{}
	}
	if f.qs[topic] == nil {
		f.qs[topic] = make(chan []byte, 1<<14)
	}
	return nil
}

func (f *fakeBenchBroker) q(topic string) chan []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.qs[topic]
}

func (f *fakeBenchBroker) Connect(context.Context) (benchkit.Conn, error) {
	return fakeBenchConn{f}, nil
}

type fakeBenchConn struct{ f *fakeBenchBroker }

func (c fakeBenchConn) Publish(ctx context.Context, topic string, body []byte) error {
	time.Sleep(time.Millisecond) // simulated confirm delay, fake time in the bubble
	select {
	case c.f.q(topic) <- slices.Clone(body):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c fakeBenchConn) Consume(_ context.Context, topic string, _ int, handle func([]byte)) (benchkit.Subscription, error) {
	s := &fakeBenchSub{stop: make(chan struct{}), done: make(chan struct{})}
	q := c.f.q(topic)
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			case b := <-q:
				handle(b)
			}
		}
	}()
	return s, nil
}

func (fakeBenchConn) Close() error { return nil }

type fakeBenchSub struct{ stop, done chan struct{} }

func (s *fakeBenchSub) Stop() error { close(s.stop); <-s.done; return nil }

// withFakeBroker makes runBench use an in-memory broker, and returns the
// last one it built.
func withFakeBroker(t *testing.T) func() *fakeBenchBroker {
	old := newBenchBroker
	var last *fakeBenchBroker
	newBenchBroker = func(string, ...sinew.Option) benchkit.Broker {
		last = &fakeBenchBroker{}
		return last
	}
	t.Cleanup(func() { newBenchBroker = old })
	return func() *fakeBenchBroker { return last }
}

func TestBenchJSON(t *testing.T) {
	broker := withFakeBroker(t)
	synctest.Test(t, func(t *testing.T) {
		var out, errOut bytes.Buffer
		// runBench, not run: run installs a signal handler, which cannot live in a bubble.
		err := runBench(t.Context(), []string{"publish", "--window", "8", "--duration", "2s", "--warmup", "0s", "--json"}, nil, &out, &errOut)
		if err != nil {
			t.Fatalf("err %v, stderr %q", err, errOut.String())
		}
		var res benchkit.Result
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("output is not JSON: %v\n%s", err, out.String())
		}
		if res.Mode != benchkit.ModePublish || res.Window != 8 || res.Messages < 15900 || res.Latency == nil {
			t.Errorf("result = %+v", res)
		}
		if !strings.HasPrefix(res.Topic, "bench-publish-") {
			t.Errorf("default topic = %q", res.Topic)
		}
		if got := broker().removed; len(got) != 1 || got[0] != res.Topic {
			t.Errorf("queues removed after the run: %q, want the run's fresh queue %q", got, res.Topic)
		}
		if n := strings.Count(errOut.String(), "\n"); n < 1 {
			t.Errorf("no progress lines on stderr: %q", errOut.String())
		}
	})
}

func TestBenchText(t *testing.T) {
	broker := withFakeBroker(t)
	synctest.Test(t, func(t *testing.T) {
		var out, errOut bytes.Buffer
		err := runBench(t.Context(), []string{"drain", "--count", "500", "--topic", "d", "--quiet"}, nil, &out, &errOut)
		if err != nil {
			t.Fatalf("err %v, stderr %q", err, errOut.String())
		}
		for _, want := range []string{"fake drain: 500 msgs", "prefill: 500 msgs"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, out.String())
			}
		}
		if errOut.Len() != 0 {
			t.Errorf("--quiet still printed %q", errOut.String())
		}
	})
	if got := broker().removed; len(got) != 0 {
		t.Errorf("a --topic queue was removed after the run: %q", got)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	withFakeBroker(t)
	for _, args := range [][]string{
		{"bench"},
		{"bench", "sideways"},
		{"bench", "publish", "--window", "-1"},
		{"bench", "publish", "--window", "99999"},
		{"bench", "mixed", "--nope"},
		{"bench", "drain", "extra"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, nil, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"bench", "--help"}, nil, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "usage: sinew bench") {
		t.Errorf("--help: exit %d, stderr %q", code, errOut.String())
	}
}

func TestPprofListenRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "10.1.2.3:0", "example.com:0", "nonsense"} {
		if err := startPprof(addr); err == nil {
			t.Errorf("startPprof(%q) accepted a non-loopback address", addr)
		}
	}
}

// --keep keeps the fresh queue a run created.
func TestBenchKeep(t *testing.T) {
	broker := withFakeBroker(t)
	synctest.Test(t, func(t *testing.T) {
		var out, errOut bytes.Buffer
		err := runBench(t.Context(), []string{"drain", "--count", "50", "--keep", "--quiet"}, nil, &out, &errOut)
		if err != nil {
			t.Fatalf("err %v, stderr %q", err, errOut.String())
		}
	})
	if got := broker().removed; len(got) != 0 {
		t.Errorf("queues removed with --keep: %q", got)
	}
}

// TestBenchDrainLongerThanDuration: a drain whose prefill and consume each
// take longer than --duration (as the README's --count 300000 does on a busy
// machine) runs to the end while it progresses.
func TestBenchDrainLongerThanDuration(t *testing.T) {
	withFakeBroker(t)
	synctest.Test(t, func(t *testing.T) {
		var out, errOut bytes.Buffer
		// One publish in flight at one fake ms each: a 3 s prefill.
		err := runBench(t.Context(), []string{"drain", "--count", "3000", "--window", "1", "--duration", "1s", "--quiet"}, nil, &out, &errOut)
		if err != nil {
			t.Fatalf("err %v, stderr %q", err, errOut.String())
		}
		if !strings.Contains(out.String(), "fake drain: 3000 msgs") {
			t.Errorf("output:\n%s", out.String())
		}
	})
}

// TestBenchDrainStallNamesDuration: a prefill that stops progressing ends
// with an error naming --duration, and no result line, since no rate was
// measured.
func TestBenchDrainStallNamesDuration(t *testing.T) {
	old := newBenchBroker
	newBenchBroker = func(string, ...sinew.Option) benchkit.Broker { return &stallingBenchBroker{after: 50} }
	t.Cleanup(func() { newBenchBroker = old })
	synctest.Test(t, func(t *testing.T) {
		var out, errOut bytes.Buffer
		err := runBench(t.Context(), []string{"drain", "--count", "1000", "--window", "1", "--duration", "1s", "--quiet"}, nil, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), "--duration") || !strings.Contains(err.Error(), "prefill confirmed 50 of 1000") {
			t.Fatalf("err %v", err)
		}
		if out.Len() != 0 {
			t.Errorf("printed a result though nothing was measured:\n%s", out.String())
		}
	})
}

// stallingBenchBroker confirms its first publishes, then holds the others
// until the publisher gives up.
type stallingBenchBroker struct {
	fakeBenchBroker
	after int
	mu    sync.Mutex
	n     int
}

func (s *stallingBenchBroker) Connect(context.Context) (benchkit.Conn, error) {
	return stallingBenchConn{fakeBenchConn{&s.fakeBenchBroker}, s}, nil
}

type stallingBenchConn struct {
	fakeBenchConn
	s *stallingBenchBroker
}

func (c stallingBenchConn) Publish(ctx context.Context, topic string, body []byte) error {
	c.s.mu.Lock()
	c.s.n++
	stall := c.s.n > c.s.after
	c.s.mu.Unlock()
	if stall {
		<-ctx.Done()
		return ctx.Err()
	}
	return c.fakeBenchConn.Publish(ctx, topic, body)
}
