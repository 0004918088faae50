package queue

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestScenarios runs the scripts in testdata/. Each command drives the queue
// through a harness that encodes, logs and applies every event, and prints
// the events with their LSNs (or the error), so a script reads as a trace of
// what the partition would write. Regenerate expectations with -rewrite and
// review the diff like code.
//
// Commands (now=T, where accepted, moves the scenario clock; it never goes
// back):
//
//	config [max-retries=N] [unlimited] [keep] [lease-ms=N] [ttl-ms=N] [target=NAME]
//	enqueue [n=N] [delay=MS] [ttl=MS] [now=T]
//	lease owner=O max=N [cohort=C member=M] [now=T]
//	assign [cohort=C] [member=M] [now=T]
//	ack offset=X lease=L
//	nack offset=X lease=L [delay=MS] [now=T]
//	fail | release offset=X lease=L [now=T]
//	extend offset=X lease=L deadline=T [now=T]
//	tick [now=T]
//	dead-lettered offset=X [now=T]
//	purge below=X max=N [now=T]
//	gap n=N                 LSNs taken by other record types
//	noop [n=N]              N records that are not queue events (raft no-ops), applied with ApplyGap
//	checkpoint              take a snapshot
//	restart                 restore the last checkpoint, replay the log, compare
//	state [now=T]           canonical dump
//	inflight owner=O | pending
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		var (
			cfg  Config
			h    = &harness{s: New(cfg), nextLSN: 1}
			now  int64
			snap []byte
		)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if err := h.s.verify(); err != nil {
				d.Fatalf(t, "before %s: %v", d.Cmd, err)
			}
			if d.HasArg("now") {
				var at int64
				d.ScanArgs(t, "now", &at)
				if at < now {
					d.Fatalf(t, "clock goes back from %d to %d", now, at)
				}
				now = at
			}
			var off, lease uint64
			if d.HasArg("offset") {
				d.ScanArgs(t, "offset", &off)
			}
			if d.HasArg("lease") {
				d.ScanArgs(t, "lease", &lease)
			}
			var delay int64
			if d.HasArg("delay") {
				d.ScanArgs(t, "delay", &delay)
			}
			s := h.s
			var evs []Event
			var err error
			switch d.Cmd {
			case "config":
				cfg = Config{}
				d.MaybeScanArgs(t, "max-retries", &cfg.MaxRetries)
				d.MaybeScanArgs(t, "lease-ms", &cfg.LeaseMs)
				d.MaybeScanArgs(t, "ttl-ms", &cfg.DefaultTTLMs)
				d.MaybeScanArgs(t, "target", &cfg.DeadLetter.Target)
				cfg.UnlimitedRetries = d.HasArg("unlimited")
				cfg.DeadLetter.Keep = d.HasArg("keep")
				s.SetConfig(cfg)
				c := s.Config()
				unlimited := ""
				if c.UnlimitedRetries {
					unlimited = " unlimited"
				}
				if c.DeadLetter.Keep {
					unlimited += " keep"
				}
				return fmt.Sprintf("max-retries=%d%s lease-ms=%d ttl-ms=%d target=%q\n",
					c.MaxRetries, unlimited, c.LeaseMs, c.DefaultTTLMs, c.DeadLetter.Target)
			case "enqueue":
				n := 1
				d.MaybeScanArgs(t, "n", &n)
				var ttl int64
				d.MaybeScanArgs(t, "ttl", &ttl)
				for range n {
					m := &Message{Body: []byte("payload")}
					if delay > 0 {
						m.NotBeforeMs = now + delay
					}
					if ttl > 0 {
						m.ExpiresAtMs = now + ttl
					}
					if evs, err = s.Enqueue(evs, m, now); err != nil {
						break
					}
				}
			case "lease":
				var owner, cohort, member string
				var max int
				d.ScanArgs(t, "owner", &owner)
				d.ScanArgs(t, "max", &max)
				d.MaybeScanArgs(t, "cohort", &cohort)
				d.MaybeScanArgs(t, "member", &member)
				evs = s.LeaseAs(nil, owner, cohort, member, max, now)
			case "assign":
				var cohort, member string
				d.MaybeScanArgs(t, "cohort", &cohort)
				d.MaybeScanArgs(t, "member", &member)
				evs, err = s.Assign(nil, cohort, member, now)

			case "ack":
				evs, err = s.Ack(nil, off, lease)
			case "nack":
				nb := int64(0)
				if delay > 0 {
					nb = now + delay
				}
				evs, err = s.Nack(nil, off, lease, nb, now)
			case "fail":
				evs, err = s.Fail(nil, off, lease, now)
			case "release":
				evs, err = s.Release(nil, off, lease, now)
			case "extend":
				var deadline int64
				d.ScanArgs(t, "deadline", &deadline)
				evs, err = s.Extend(nil, off, lease, deadline, now)
			case "tick":
				evs = s.Tick(nil, now)
			case "dead-lettered":
				evs, err = s.DeadLettered(nil, off, now)
			case "purge":
				var below uint64
				var max int
				d.ScanArgs(t, "below", &below)
				d.ScanArgs(t, "max", &max)
				evs = s.Purge(nil, below, max, now)
			case "gap":
				var n uint64
				d.ScanArgs(t, "n", &n)
				h.nextLSN += n
				return fmt.Sprintf("next record lsn %d\n", h.nextLSN)
			case "noop":
				n := 1
				d.MaybeScanArgs(t, "n", &n)
				var b strings.Builder
				for range n {
					lsn, err := h.gap()
					if err != nil {
						d.Fatalf(t, "apply gap: %v", err)
					}
					fmt.Fprintf(&b, "%d: noop\n", lsn)
				}
				return b.String()
			case "checkpoint":
				snap = s.Snapshot(nil)
				return fmt.Sprintf("checkpoint covers lsn < %d (%d bytes)\n", s.NextLSN(), len(snap))
			case "restart":
				from := New(cfg)
				if snap != nil {
					if from, err = Restore(cfg, snap); err != nil {
						d.Fatalf(t, "restore: %v", err)
					}
				}
				skip := from.NextLSN()
				if err := replay(from, h.log); err != nil {
					d.Fatalf(t, "replay: %v", err)
				}
				replayed := 0
				for _, r := range h.log {
					if r.lsn >= skip {
						replayed++
					}
				}
				if got, want := dump(from, now), dump(s, now); got != want {
					d.Fatalf(t, "restarted state differs:\n%s\nwant:\n%s", got, want)
				}
				h.s = from
				return fmt.Sprintf("restored lsn < %d from checkpoint, replayed %d records: state identical\n", skip, replayed)
			case "state":
				return dump(s, now)
			case "inflight", "pending":
				var infos []Info
				if d.Cmd == "pending" {
					infos = s.PendingDeadLetters()
				} else {
					var owner string
					d.ScanArgs(t, "owner", &owner)
					infos = s.Inflight(owner)
				}
				var b strings.Builder
				for _, in := range infos {
					b.WriteString(formatInfo(in) + "\n")
				}
				if b.Len() == 0 {
					return "none\n"
				}
				return b.String()
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			if err != nil {
				return fmt.Sprintf("error %s: %v\n", errName(err), err)
			}
			lsns, aerr := h.apply(evs)
			if aerr != nil {
				d.Fatalf(t, "apply: %v", aerr)
			}
			if len(evs) == 0 {
				return "no events\n"
			}
			var b strings.Builder
			for i, ev := range evs {
				fmt.Fprintf(&b, "%d: %s\n", lsns[i], formatEvent(ev))
			}
			return b.String()
		})
	})
}

func errName(err error) string {
	for _, e := range []struct {
		err  error
		name string
	}{
		{ErrStaleLease, "ErrStaleLease"},
		{ErrAlreadyRequeued, "ErrAlreadyRequeued"},
		{ErrAlreadySettled, "ErrAlreadySettled"},
		{ErrUnknownOffset, "ErrUnknownOffset"},
		{ErrNotDeadLettering, "ErrNotDeadLettering"},
		{ErrInvalidMessage, "ErrInvalidMessage"},
		{ErrInvalidDeadline, "ErrInvalidDeadline"},
		{ErrCorrupt, "ErrCorrupt"},
		{ErrGateBusy, "ErrGateBusy"},
	} {
		if errors.Is(err, e.err) {
			return e.name
		}
	}
	return "untyped"
}
