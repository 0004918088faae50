package e2e_test

import (
	"bufio"
	"bytes"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// cliProc is a `sinew publish` or `sinew consume` child process whose stdout is
// read line by line.
type cliProc struct {
	cmd    *exec.Cmd
	stderr lockedBuffer
	mu     sync.Mutex
	lines  []string
	seen   chan int // the line count, sent (without blocking) after each line
	done   chan struct{}
	status int
}

// lockedBuffer is a bytes.Buffer that a child's stderr copier and the test
// may use at once (a failing test reads it while the child still runs).
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func startCLI(t *testing.T, bin string, args ...string) *cliProc {
	t.Helper()
	p := &cliProc{cmd: exec.Command(bin, args...), seen: make(chan int, 1), done: make(chan struct{})}
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 0, 64<<10), 2<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			n := len(p.lines)
			p.mu.Unlock()
			select {
			case <-p.seen:
			default:
			}
			p.seen <- n
		}
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.status = ee.ExitCode()
		default:
			p.status = -1
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *cliProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *cliProc) wait(t *testing.T, name string) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(3 * safetyTimeout):
		t.Fatalf("%s did not exit; stderr:\n%s", name, p.stderr.String())
	}
}

// TestRollingRestartCLI runs the operator's rolling restart with the real
// commands: `sinew serve` (broker A), `sinew publish --window 64` and `sinew
// consume --prefetch 64` mid-stream, SIGTERM to A, then broker B on the same
// data directory and address. Both commands must exit 0, the consumer must have
// printed every confirmed message, and A's drain must end before its deadline
// (its log says timed_out=false). Duplicates are logged; the goal is none.
func TestRollingRestartCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	const total, interruptAt = 40000, 100
	bin := buildSinew(t)
	dir := t.TempDir()
	a := startChildArgs(t, bin, dir, "--runtime-seed-connection-drain-timeout-ms", "10000")

	pub := startCLI(t, bin, "publish", "--addr", a.addr, "--topic", "roll", "--count", strconv.Itoa(total),
		"--size", "256", "--window", "64")
	con := startCLI(t, bin, "consume", "--addr", a.addr, "--topic", "roll", "--prefetch", "64", "--idle-exit", "4s")

	// Interrupt both mid-stream: the consumer has printed some lines, not all.
	deadline := time.After(safetyTimeout)
	for n := 0; n < interruptAt; {
		select {
		case n = <-con.seen:
		case <-con.done:
			t.Fatalf("consume exited early (status %d):\n%s", con.status, con.stderr.String())
		case <-deadline:
			t.Fatalf("consume printed fewer than %d lines; stderr:\n%s", interruptAt, con.stderr.String())
		}
	}
	if pub.exited() {
		t.Fatalf("publish finished before the restart; raise total")
	}
	status, took := termChild(t, a)
	con.mu.Lock()
	atTerm := len(con.lines)
	con.mu.Unlock()
	t.Logf("broker A drained in %v (exit %d); consumer had printed %d of %d", took.Round(time.Millisecond), status, atTerm, total)
	drainLog := a.log()
	if status != 0 {
		t.Errorf("broker A exit status %d:\n%s", status, drainLog)
	}
	if !strings.Contains(drainLog, "timed_out=false") {
		t.Errorf("broker A's drain ran to its deadline:\n%s", grepLines(drainLog, "drain", "kept"))
	}
	b := startChildArgs(t, bin, dir, "--listen", a.addr, "--runtime-seed-connection-drain-timeout-ms", "10000")

	pub.wait(t, "publish")
	con.wait(t, "consume")
	if pub.status != 0 {
		t.Errorf("publish exit status %d; stderr:\n%s", pub.status, pub.stderr.String())
	}
	if con.status != 0 {
		t.Errorf("consume exit status %d; stderr:\n%s", con.status, con.stderr.String())
	}
	if !strings.Contains(pub.stderr.String()+strings.Join(pub.lines, "\n"), "confirmed "+strconv.Itoa(total)+",") {
		t.Errorf("publish did not confirm all %d; stdout:\n%s\nstderr:\n%s", total, strings.Join(pub.lines, "\n"), pub.stderr.String())
	}
	counts := make(map[int]int, total)
	for _, l := range con.lines {
		f, _, _ := strings.Cut(l, " ")
		s, ok := strings.CutPrefix(f, "seq=")
		if !ok {
			t.Fatalf("unexpected consumer line %.60q", l)
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("unexpected consumer line %.60q", l)
		}
		counts[n]++
	}
	dups := 0
	for _, c := range counts {
		dups += c - 1
	}
	t.Logf("consumer printed %d lines, %d distinct, %d duplicates", len(con.lines), len(counts), dups)
	if len(counts) != total {
		t.Errorf("consumer printed %d distinct messages, want %d (lost %d)", len(counts), total, total-len(counts))
	}
	if t.Failed() {
		t.Logf("broker A:\n%s\nbroker B:\n%s", grepLines(drainLog, "drain", "kept", "session"), grepLines(b.log(), "session", "adopt", "lease"))
	}
}

// grepLines returns the lines of s that contain any of words.
func grepLines(s string, words ...string) string {
	var b strings.Builder
	for l := range strings.SplitSeq(s, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				b.WriteString(l + "\n")
				break
			}
		}
	}
	return b.String()
}

// TestDrainBehindBacklogCLI: `sinew consume --prefetch 64` works through a
// backlog, settling in a steady stream, when its broker gets SIGTERM. The
// drain leases it nothing new (the consumer prints at most about a prefetch
// more), so once it has settled what it holds the drain ends, well before
// its deadline (timed_out=false); the consumer then
// finishes the backlog on the restarted broker, every message once.
func TestDrainBehindBacklogCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	const total, interruptAt = 20000, 500
	bin := buildSinew(t)
	dir := t.TempDir()
	a := startChildArgs(t, bin, dir, "--runtime-seed-connection-drain-timeout-ms", "60000")
	pub := startCLI(t, bin, "publish", "--addr", a.addr, "--topic", "backlog", "--count", strconv.Itoa(total),
		"--size", "64", "--window", "64")
	pub.wait(t, "publish")
	if pub.status != 0 {
		t.Fatalf("publish exit status %d; stderr:\n%s", pub.status, pub.stderr.String())
	}
	con := startCLI(t, bin, "consume", "--addr", a.addr, "--topic", "backlog", "--prefetch", "64", "--idle-exit", "4s")
	deadline := time.After(safetyTimeout)
	for n := 0; n < interruptAt; {
		select {
		case n = <-con.seen:
		case <-con.done:
			t.Fatalf("consume exited early (status %d):\n%s", con.status, con.stderr.String())
		case <-deadline:
			t.Fatalf("consume printed fewer than %d lines; stderr:\n%s", interruptAt, con.stderr.String())
		}
	}
	con.mu.Lock()
	atTerm := len(con.lines)
	con.mu.Unlock()
	status, took := termChild(t, a)
	con.mu.Lock()
	atExit := len(con.lines)
	con.mu.Unlock()
	drainLog := a.log()
	t.Logf("broker A drained in %v (exit %d); the consumer printed %d lines during the drain",
		took.Round(time.Millisecond), status, atExit-atTerm)
	// Draining, the broker leases nothing new: the consumer finishes what it
	// holds (its prefetch, plus what it got while the signal reached the
	// broker: a few dozen on a loaded machine), not the backlog of ~19,500.
	const duringMax = 1000
	if during := atExit - atTerm; during > duringMax {
		t.Errorf("the consumer printed %d messages while broker A drained, want at most %d: the drain kept leasing", during, duringMax)
	}
	if status != 0 {
		t.Errorf("broker A exit status %d:\n%s", status, drainLog)
	}
	// The deadline is a minute: a drain that waited for it would show here.
	if !strings.Contains(drainLog, "timed_out=false") {
		t.Errorf("broker A's drain ran to its deadline:\n%s", grepLines(drainLog, "drain"))
	}
	startChildArgs(t, bin, dir, "--listen", a.addr)
	con.wait(t, "consume")
	if con.status != 0 {
		t.Errorf("consume exit status %d; stderr:\n%s", con.status, con.stderr.String())
	}
	counts := make(map[string]int, total)
	for _, l := range con.lines {
		f, _, _ := strings.Cut(l, " ")
		counts[f]++
	}
	dups := 0
	for _, c := range counts {
		dups += c - 1
	}
	t.Logf("consumer printed %d lines, %d distinct, %d duplicates", len(con.lines), len(counts), dups)
	if len(counts) != total {
		t.Errorf("consumer printed %d distinct messages, want %d", len(counts), total)
	}
}
