package e2e_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/test/chaos/faultproxy"
)

// TestPublishRidesThroughCuts runs the real `sinew publish` behind a proxy
// that resets its socket every ~200 KB: every message is confirmed, none
// fails, nothing is printed on stderr, and the queue holds every message (a
// message whose confirm was lost in a cut is sent again, so it may be stored
// twice: at least once).
func TestPublishRidesThroughCuts(t *testing.T) {
	const total = 3000
	bin := buildSinew(t)
	n := startNodeOpts(t, t.TempDir(), nil, nodeOpts{server: func(c *server.Config) { c.ReconnectGraceMs = 5000 }})
	p, err := faultproxy.Start("127.0.0.1:0", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.CutEvery(200 << 10)
	code, out, errOut := runSinew(t, bin, "", "publish", "--addr", p.Addr(), "--topic", "pcuts",
		"--count", fmt.Sprint(total), "--size", "1000")
	if code != 0 || errOut != "" {
		t.Fatalf("publish exited %d after %d cuts:\n%s", code, p.Stats().Cut, errOut)
	}
	if want := fmt.Sprintf("published to pcuts: confirmed %d, failed 0\n", total); out != want {
		t.Fatalf("summary %q, want %q", out, want)
	}
	cuts := p.Stats().Cut
	if cuts < 5 {
		t.Fatalf("only %d cuts; the test needs several", cuts)
	}
	ctx := sdkCtx(t)
	c := sdkDial(t, n.addr)
	sub, err := c.Subscribe(ctx, "pcuts", sinew.WithPrefetch(256))
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]bool, total)
	for len(seen) < total {
		m := sdkRecv(t, sub)
		seq, _, _ := strings.Cut(m.Text(), " ")
		seen[seq] = true
		m.CompleteAsync()
	}
	t.Logf("%d of %d published through %d cuts", len(seen), total, cuts)
}
