package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sinewmq/sinew/internal/benchkit"
)

// Bounds on a whole comparison.
const (
	totalTimeMax = 40 * time.Minute
	idleSettle   = 2 * time.Second // broker start-up to the idle RSS sample
	drainBound   = 2 * time.Minute // longest a drain may take before the cell fails
)

type options struct {
	sinewBin, sinewArgs, natsBin, rabbitSbin string
	brokers, cells                           string
	work, out, report                        string
	runs                                     int
	duration, warmup                         time.Duration
	backlog, rate                            int
	versions                                 string
	profileCell                              string
	profileFor, profileAfter                 time.Duration
	skip                                     string
}

func main() {
	var o options
	flag.StringVar(&o.sinewBin, "sinew", "", "path to the sinew binary")
	flag.StringVar(&o.sinewArgs, "sinew-args", "", "extra flags for sinew serve")
	flag.StringVar(&o.natsBin, "nats", "", "path to nats-server")
	flag.StringVar(&o.rabbitSbin, "rabbitmq-sbin", "/usr/lib/rabbitmq/bin", "directory with rabbitmq-server and rabbitmqctl")
	flag.StringVar(&o.brokers, "brokers", "sinew,nats-js,nats-js-sync,rabbitmq", "broker configurations to run, comma-separated")
	flag.StringVar(&o.cells, "cells", "publish-w1,publish-w64,drain,mixed", "workloads to run, comma-separated")
	flag.StringVar(&o.work, "work", "", "scratch directory for data directories (default: a new temporary one)")
	flag.StringVar(&o.out, "out", ".", "directory for results.json, comparison.md and comparison.svg")
	flag.StringVar(&o.report, "report", "", "render comparison.md and comparison.svg from this results.json and exit")
	flag.IntVar(&o.runs, "runs", 3, "runs per cell (the median is reported)")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "measured phase of the publish and mixed cells")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured lead-in of the publish and mixed cells")
	flag.IntVar(&o.backlog, "backlog", 300000, "messages prefilled by the drain cell (its RSS-with-backlog sample too)")
	flag.IntVar(&o.rate, "rate", 20000, "publish rate of the mixed cell, msg/s")
	flag.StringVar(&o.versions, "versions", "", "broker versions to record, as name=version;name=version")
	flag.StringVar(&o.profileCell, "sinew-profile", "", "cells (comma-separated) during whose first run to take a CPU profile of sinew serve (served on SINEW_PPROF_LISTEN)")
	flag.DurationVar(&o.profileFor, "profile-seconds", 4*time.Second, "length of that CPU profile")
	flag.DurationVar(&o.profileAfter, "profile-after", -1, "start the profile this long into the cell (default: after its warm-up)")
	flag.StringVar(&o.skip, "skip", "", "broker:cell pairs not to run, comma-separated (e.g. nats-js-sync:drain)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.report != "" {
		b, err := os.ReadFile(o.report)
		if err != nil {
			return err
		}
		var f resultsFile
		if err := json.Unmarshal(b, &f); err != nil {
			return fmt.Errorf("%s: %w", o.report, err)
		}
		return render(&f, o.out)
	}
	if o.runs < 1 || o.runs > 10 {
		return errors.New("-runs must be within 1..10")
	}
	cells, err := pickCells(o)
	if err != nil {
		return err
	}
	servers, err := pickServers(o)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, totalTimeMax)
	defer cancel()

	work := o.work
	if work == "" {
		if work, err = os.MkdirTemp("", "sinew-compare-"); err != nil {
			return err
		}
		defer os.RemoveAll(work)
	}
	f := &resultsFile{
		Started:  time.Now().UTC(),
		Versions: parseVersions(o.versions),
		Settings: map[string]string{
			"runs": fmt.Sprint(o.runs), "duration": o.duration.String(), "warmup": o.warmup.String(),
			"backlog": fmt.Sprint(o.backlog), "rate": fmt.Sprint(o.rate), "size_bytes": "1024",
			"work_dir": work,
		},
	}
	for _, s := range servers {
		f.Brokers = append(f.Brokers, s.name())
	}
	skip := strings.Split(o.skip, ",")
	if o.skip != "" {
		f.Settings["skipped"] = o.skip
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	for runNo := 1; runNo <= o.runs; runNo++ {
		for _, s := range servers {
			for _, c := range cells {
				if ctx.Err() != nil {
					break
				}
				if slices.Contains(skip, s.name()+":"+c.id) {
					continue
				}
				var prof *profileReq
				if ss, ok := s.(*sinewServer); ok && runNo == 1 && slices.Contains(strings.Split(o.profileCell, ","), c.id) {
					prof = &profileReq{srv: ss, after: c.cfg.Warmup, length: o.profileFor,
						path: filepath.Join(o.out, "sinew-"+c.id+".cpu.pprof")}
					if o.profileAfter >= 0 {
						prof.after = o.profileAfter
					}
				}
				rec := runCell(ctx, s, c, runNo, work, prof)
				f.Records = append(f.Records, rec)
				logRecord(rec)
				// Keep what is measured so far, so an interrupted comparison
				// still leaves its numbers.
				if err := writeJSON(filepath.Join(o.out, "results.json"), f); err != nil {
					return err
				}
			}
		}
	}
	f.Finished = time.Now().UTC()
	if err := writeJSON(filepath.Join(o.out, "results.json"), f); err != nil {
		return err
	}
	if err := render(f, o.out); err != nil {
		return err
	}
	return ctx.Err()
}

// cell is one workload of the comparison.
type cell struct {
	id  string
	cfg benchkit.Config
}

func pickCells(o options) ([]cell, error) {
	all := []cell{
		{"publish-w1", benchkit.Config{Mode: benchkit.ModePublish, Window: 1, Duration: o.duration, Warmup: o.warmup}},
		{"publish-w64", benchkit.Config{Mode: benchkit.ModePublish, Window: 64, Duration: o.duration, Warmup: o.warmup}},
		{"drain", benchkit.Config{Mode: benchkit.ModeDrain, Count: o.backlog, Window: 256, Prefetch: 256, Duration: drainBound}},
		{"mixed", benchkit.Config{Mode: benchkit.ModeMixed, RatePerSec: o.rate, Window: 256, Prefetch: 256, Duration: o.duration, Warmup: o.warmup}},
	}
	var out []cell
	for _, id := range strings.Split(o.cells, ",") {
		i := slices.IndexFunc(all, func(c cell) bool { return c.id == strings.TrimSpace(id) })
		if i < 0 {
			return nil, fmt.Errorf("unknown cell %q", id)
		}
		c := all[i]
		c.cfg.SizeBytes, c.cfg.Connections = 1024, 1
		out = append(out, c)
	}
	return out, nil
}

func pickServers(o options) ([]server, error) {
	var out []server
	for _, name := range strings.Split(o.brokers, ",") {
		switch strings.TrimSpace(name) {
		case "sinew":
			if o.sinewBin == "" {
				return nil, errors.New("-sinew is required for the sinew broker")
			}
			out = append(out, &sinewServer{bin: o.sinewBin, args: o.sinewArgs})
		case "nats-js", "nats-js-sync":
			if o.natsBin == "" {
				return nil, errors.New("-nats is required for the nats brokers")
			}
			out = append(out, &natsServer{bin: o.natsBin, sync: strings.TrimSpace(name) == "nats-js-sync"})
		case "rabbitmq":
			out = append(out, &rabbitServer{sbin: o.rabbitSbin})
		default:
			return nil, fmt.Errorf("unknown broker %q", name)
		}
	}
	return out, nil
}

// runCell starts a fresh broker, samples its idle RSS, runs the workload and
// stops the broker again, removing its data.
func runCell(ctx context.Context, s server, c cell, runNo int, work string, prof *profileReq) (rec record) {
	rec = record{Broker: s.name(), Cell: c.id, Run: runNo}
	dir := filepath.Join(work, fmt.Sprintf("%s-%s-%d", s.name(), c.id, runNo))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		rec.Error = err.Error()
		return rec
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(os.Stderr, "== %s %s run %d: starting broker\n", s.name(), c.id, runNo)
	if err := s.start(ctx, dir); err != nil {
		rec.Error = "start: " + err.Error() + tailLog(dir)
		if serr := s.stop(); serr != nil {
			rec.Error += "; stop: " + serr.Error()
		}
		return rec
	}
	defer func() {
		if err := s.stop(); err != nil {
			rec.Error = strings.TrimPrefix(rec.Error+"; stop: "+err.Error(), "; ")
		}
	}()
	select {
	case <-time.After(idleSettle):
	case <-ctx.Done():
		rec.Error = ctx.Err().Error()
		return rec
	}
	procFS := os.DirFS("/proc")
	if p, err := benchkit.ReadProc(procFS, s.pid(), time.Now()); err == nil {
		rec.IdleRSSBytes = p.RSSBytes
	}
	cfg := c.cfg
	cfg.Topic = fmt.Sprintf("bench-%s-%d", c.id, runNo)
	cfg.PID = s.pid()
	cfg.ProcFS = procFS
	cfg.Progress = os.Stderr
	profDone := make(chan struct{})
	if prof != nil {
		go func() {
			defer close(profDone)
			if err := prof.take(ctx); err != nil {
				fmt.Fprintf(os.Stderr, "  CPU profile: %v\n", err)
			} else {
				fmt.Fprintf(os.Stderr, "  CPU profile written to %s (go tool pprof -top %s %s)\n", prof.path, prof.srv.bin, prof.path)
			}
		}()
	} else {
		close(profDone)
	}
	res, err := benchkit.Run(ctx, s.broker(), cfg)
	<-profDone
	if res.Broker != "" {
		rec.Result = &res
	}
	if err != nil {
		rec.Error = err.Error()
	}
	return rec
}

// profileReq asks for a CPU profile of sinew serve while a cell runs.
type profileReq struct {
	srv    *sinewServer
	after  time.Duration // skip the warmup
	length time.Duration
	path   string
}

// take fetches /debug/pprof/profile from the broker's profiling listener.
func (p *profileReq) take(ctx context.Context) error {
	select {
	case <-time.After(p.after):
	case <-ctx.Done():
		return ctx.Err()
	}
	secs := max(1, int(p.length/time.Second))
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.srv.pprof, secs)
	rctx, cancel := context.WithTimeout(ctx, p.length+30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(p.path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, io.LimitReader(resp.Body, 64<<20)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// tailLog returns the last lines of the broker's log files, for a failed start.
func tailLog(dir string) string {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var b strings.Builder
	for _, l := range logs {
		data, err := os.ReadFile(l)
		if err != nil || len(data) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		lines = lines[max(0, len(lines)-5):]
		fmt.Fprintf(&b, "\n  %s: %s", filepath.Base(l), strings.Join(lines, "\n    "))
	}
	return b.String()
}

func logRecord(r record) {
	if r.Result != nil {
		_ = r.Result.WriteText(os.Stderr)
	}
	if r.IdleRSSBytes > 0 {
		fmt.Fprintf(os.Stderr, "  idle RSS %.1f MiB\n", float64(r.IdleRSSBytes)/(1<<20))
	}
	if r.Error != "" {
		fmt.Fprintf(os.Stderr, "  ERROR: %s\n", r.Error)
	}
}

func parseVersions(s string) map[string]string {
	m := map[string]string{}
	for _, kv := range strings.Split(s, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func render(f *resultsFile, out string) error {
	md, err := os.Create(filepath.Join(out, "comparison.md"))
	if err != nil {
		return err
	}
	if err := writeMarkdown(md, f); err != nil {
		md.Close()
		return err
	}
	if err := md.Close(); err != nil {
		return err
	}
	svg, err := os.Create(filepath.Join(out, "comparison.svg"))
	if err != nil {
		return err
	}
	if err := writeSVG(svg, f); err != nil {
		svg.Close()
		return err
	}
	return svg.Close()
}
