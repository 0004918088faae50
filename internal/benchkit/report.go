package benchkit

import (
	"fmt"
	"io"
)

// WriteText prints r for people: throughput, latency and the broker process's
// footprint, a few lines long.
func (r Result) WriteText(w io.Writer) error {
	var err error
	p := func(format string, a ...any) {
		if err == nil {
			_, err = fmt.Fprintf(w, format, a...)
		}
	}
	p("%s %s: %d msgs x %d B in %.2fs = %.0f msg/s, %.1f MB/s", r.Broker, r.Mode, r.Messages, r.SizeBytes, r.Seconds, r.MsgPerSec, r.MBPerSec)
	switch r.Mode {
	case ModePublish:
		p(" (window %d, %d conn)\n", r.Window, r.Connections)
	case ModeDrain:
		p(" (prefetch %d, %d conn)\n", r.Prefetch, r.Connections)
	case ModeMixed:
		p(" (rate %d msg/s, window %d, prefetch %d, %d conn)\n", r.RatePerSec, r.Window, r.Prefetch, r.Connections)
	default:
		p("\n")
	}
	if r.Prefill != nil {
		p("  prefill: %d msgs in %.2fs = %.0f msg/s\n", r.Prefill.Messages, r.Prefill.Seconds, r.Prefill.MsgPerSec)
	}
	if l := r.Latency; l != nil {
		what := "publish->confirm"
		if r.Mode == ModeMixed {
			what = "due->delivery"
		}
		p("  latency %s (ms): p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  mean %.3f  (n=%d)\n", what, l.P50, l.P90, l.P99, l.Max, l.Mean, l.Count)
	}
	if r.Missing > 0 {
		p("  missing: %d messages due in the measured phase not delivered (%d never sent)\n", r.Missing, r.Unsent)
	}
	if r.Errors > 0 {
		p("  errors: %d (first: %s)\n", r.Errors, r.FirstError)
	}
	if pr := r.Proc; pr != nil {
		p("  broker pid %d: RSS start %.1f MiB", pr.PID, mib(pr.RSSStartBytes))
		if pr.RSSBacklogBytes > 0 {
			p(", with backlog %.1f MiB", mib(pr.RSSBacklogBytes))
		}
		p(", end %.1f MiB, peak %.1f MiB; CPU %.0f%% of one core\n", mib(pr.RSSEndBytes), mib(pr.RSSPeakBytes), pr.CPUPercent)
	}
	return err
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
