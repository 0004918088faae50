package clusternode

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// capture is a slog.Handler that keeps every record's level and message.
type capture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }
func (c *capture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, r)
	return nil
}
func (c *capture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *capture) WithGroup(string) slog.Handler      { return c }

func (c *capture) count(level slog.Level) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.recs {
		if r.Level == level {
			n++
		}
	}
	return n
}

// memberlist's errors and warnings reach the log at WARN, at most
// memberlistWarnsMax per window; the rest go to DEBUG and are counted in
// one WARN line when the next window opens. Its other lines are DEBUG.
func TestMemberlistLogBoundsWarnings(t *testing.T) {
	c := &capture{}
	now := time.Unix(1_000_000, 0)
	w := &memberlistLog{logger: slog.New(c), now: func() time.Time { return now }}
	for range memberlistWarnsMax + 5 {
		w.Write([]byte("[ERR] memberlist: Received invalid msgType (0) from=127.0.0.1:1\n"))
	}
	w.Write([]byte("[DEBUG] memberlist: Stream connection from=127.0.0.1:2\n"))
	if got := c.count(slog.LevelWarn); got != memberlistWarnsMax {
		t.Fatalf("%d WARN lines in one window, want %d", got, memberlistWarnsMax)
	}
	if got := c.count(slog.LevelDebug); got != 6 {
		t.Fatalf("%d DEBUG lines, want 5 suppressed warnings and 1 debug line", got)
	}
	now = now.Add(memberlistWarnWindowMs * time.Millisecond)
	w.Write([]byte("[WARN] memberlist: Was able to connect to n1 over TCP but UDP probes failed\n"))
	if got := c.count(slog.LevelWarn); got != memberlistWarnsMax+2 {
		t.Fatalf("%d WARN lines after the next window opened, want %d (the summary and the line)", got, memberlistWarnsMax+2)
	}
	c.mu.Lock()
	summary := c.recs[len(c.recs)-2]
	c.mu.Unlock()
	var suppressed int64
	summary.Attrs(func(a slog.Attr) bool {
		if a.Key == "suppressed" {
			suppressed = a.Value.Int64()
		}
		return true
	})
	if suppressed != 5 {
		t.Fatalf("the summary counts %d suppressed, want 5 (%q)", suppressed, summary.Message)
	}
}
