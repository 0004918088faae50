package e2e_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/test/chaos/faultproxy"
)

// TestConsumeRidesThroughCuts runs the real `sinew consume --prefetch 16`
// behind a proxy that resets its socket every ~200 KB, with the reconnect grace
// `sinew serve` seeds (5 s): it consumes all 3,000 messages, each exactly once,
// prints no error and exits 0; the queue is empty afterwards.
func TestConsumeRidesThroughCuts(t *testing.T) {
	const (
		total     = 3000
		bodyBytes = 1000
		cutBytes  = 200 << 10
	)
	bin := buildSinew(t)
	n := startNodeOpts(t, t.TempDir(), nil, nodeOpts{server: func(c *server.Config) { c.ReconnectGraceMs = 5000 }})
	ctx := sdkCtx(t)
	pub := sdkDial(t, n.addr)
	futures := make([]*sinew.PublishFuture, total)
	for i := range futures {
		body := fmt.Sprintf("m%05d-%s", i, strings.Repeat("x", bodyBytes))
		futures[i] = pub.PublishAsync(ctx, "cuts", []byte(body))
	}
	for i, f := range futures {
		if _, err := f.Wait(ctx); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}

	p, err := faultproxy.Start("127.0.0.1:0", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.CutEvery(cutBytes)
	code, out, errOut := runSinew(t, bin, "", "consume", "--addr", p.Addr(), "--topic", "cuts",
		"--prefetch", "16", "--count", fmt.Sprint(total))
	if code != 0 {
		t.Fatalf("consume exited %d after %d cuts:\n%s", code, p.Stats().Cut, errOut)
	}
	if strings.Contains(strings.ToLower(errOut), "error") {
		t.Fatalf("consume printed an error:\n%s", errOut)
	}
	cuts := p.Stats().Cut
	if cuts < 5 {
		t.Fatalf("only %d cuts; the test needs several", cuts)
	}
	seen := make(map[string]int, total)
	lines := 0
	for line := range strings.Lines(out) {
		lines++
		id, _, _ := strings.Cut(line, "-")
		seen[id]++
	}
	if lines != total || len(seen) != total {
		t.Fatalf("%d lines, %d distinct messages; want %d of each", lines, len(seen), total)
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("message %s printed %d times", id, k)
		}
	}
	// Every ack counted: nothing but a marker published now is left.
	if _, err := pub.Publish(ctx, "cuts", []byte("marker")); err != nil {
		t.Fatal(err)
	}
	sub, err := pub.Subscribe(ctx, "cuts")
	if err != nil {
		t.Fatal(err)
	}
	if m := sdkRecv(t, sub); m.Text() != "marker" {
		t.Fatalf("after the run the queue still held %.12q", m.Text())
	}
	t.Logf("3000 of 3000 consumed exactly once through %d cuts", cuts)
}
