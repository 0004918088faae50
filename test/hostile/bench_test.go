package hostile_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/test/chaos/harness"
)

// benchBacklog is the backlog the non-readers of the benchmark lease from.
const benchBacklog = 20_000

// BenchmarkPublishUnderHostile measures a well-behaved client's publish
// latency (one PUBLISH at a time, from send to its confirm, which comes after
// the fsync) against one real `sinew serve` child process, in two
// sub-benchmarks of the same run: "baseline" with no other peer, then
// "hostile" while the soak's 170 misbehaving peers (mix140 plus 20 sending
// wrong credentials in a loop and 10 sending oversized frames) run against
// the same broker. Each reports p50-us and p99-us, and "hostile" reports
// p99-ratio, its p99 over the median baseline p99 of the same run, whose
// goal is at most 2. Run it with a fixed
// count, so both halves have the same number of samples:
//
//	go test -run '^$' -bench PublishUnderHostile -benchtime 2000x ./test/hostile
func BenchmarkPublishUnderHostile(b *testing.B) {
	dir := b.TempDir()
	credentials = boundedToken
	defer func() { credentials = "" }()
	args := slices.Clone(boundedArgs)
	br, err := harness.New(harness.Config{Binary: sinewBinary(b), DataDir: filepath.Join(dir, "data"), ExtraArgs: args, Credentials: credentials})
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	if err := br.Start(); err != nil {
		b.Fatalf("start: %v\n%s", err, br.StderrTail())
	}
	if err := publishBacklog(br.Addr(), topic, benchBacklog, bodyBytes); err != nil {
		b.Fatalf("%v\n%s", err, br.StderrTail())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := sinew.Dial(ctx, br.Addr(), sinew.WithClientName("bench-good"), sinew.WithCredentials(credentials))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	body := make([]byte, bodyBytes)
	// With -count N each sub-benchmark runs N times in a row (every
	// baseline, then every hostile run), so a hostile run is compared with
	// the median p99 of the baselines before it.
	var baseP99 []time.Duration
	measure := func(hostile bool) func(b *testing.B) {
		return func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for b.Loop() {
				t0 := time.Now()
				if _, err := c.Publish(ctx, "bench-good", body); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
			p99 := pct(0.99)
			b.ReportMetric(float64(pct(0.50).Microseconds()), "p50-us")
			b.ReportMetric(float64(p99.Microseconds()), "p99-us")
			if !hostile {
				baseP99 = append(baseP99, p99)
				return
			}
			if len(baseP99) > 0 {
				base := slices.Clone(baseP99)
				slices.Sort(base)
				// The goal: at most 2.
				b.ReportMetric(float64(p99)/float64(base[len(base)/2]), "p99-ratio")
			}
		}
	}
	b.Run("baseline", measure(false))

	m := mix140
	m.wrongauth, m.oversized = 20, 10
	pctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var st *peerStats
	wg.Add(1)
	go func() { defer wg.Done(); st = runPeers(pctx, br.Addr(), topic, m, 10_000) }()
	// A measurement pause, not a wait for a condition: the peers connect
	// and settle into their loops before the hostile half starts.
	time.Sleep(2 * time.Second)
	b.Run("hostile", measure(true))
	stop()
	wg.Wait()
	if !br.Running() {
		b.Fatalf("broker exited: %v\n%s", br.ExitErr(), br.StderrTail())
	}
	b.Logf("peers %d, dials %d, wrong credentials refused %d, oversized frames refused %d",
		m.total(), st.dials.Load(), st.authFailed.Load(), st.tooLarge.Load())
}
