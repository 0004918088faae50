package e2e_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/broker"
)

// runSinew runs one sinew command to its end and returns its exit code and
// output. safetyTimeout bounds it, so a command that hangs fails the test.
func runSinew(t *testing.T, bin, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("sinew %v did not finish within %v:\n%s", args, safetyTimeout, errb.String())
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("sinew %v: %v", args, err)
	}
	return code, out.String(), errb.String()
}

// stopChild sends SIGINT and waits for a clean exit.
func stopChild(t *testing.T, c *child) {
	t.Helper()
	if err := c.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(safetyTimeout):
		t.Fatalf("sinew serve did not exit after SIGINT:\n%s", c.log())
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("sinew serve after SIGINT: %v\n%s", err, c.log())
	}
}

// queueCounts opens dir in this process, as a restart would, and returns the
// messages ready in each topic and the number of quarantined partitions.
func queueCounts(t *testing.T, dir string) (ready map[string]int, quarantined int) {
	t.Helper()
	b, err := broker.Open(broker.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ready = map[string]int{}
	for _, q := range b.Stats().Queues {
		for _, p := range q.Partitions {
			ready[q.Topic] += p.Ready
			if p.Quarantined {
				quarantined++
			}
		}
	}
	return ready, quarantined
}

// snapshotDir describes every file under dir but the lock file: size,
// modification time and a hash of the contents.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "LOCK" {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[p] = fmt.Sprintf("%d %s %x", fi.Size(), fi.ModTime().Format(time.RFC3339Nano), sha256.Sum256(data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTwoBrokersOneDir: a second `sinew serve` on a live broker's data dir
// exits at once with one line naming the first one's pid, and the first
// keeps serving; after a restart the count is exact.
func TestTwoBrokersOneDir(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	dir := t.TempDir()
	a := startChild(t, bin, dir)
	pid := a.cmd.Process.Pid

	code, _, errOut := runSinew(t, bin, "", "serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--admin-listen", "")
	want := fmt.Sprintf("sinew serve: data dir %s is locked by another process (pid %d)", dir, pid)
	if code != 1 || !strings.HasPrefix(errOut, want) || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("second serve: exit %d, stderr %q; want exit 1 and one line starting %q", code, errOut, want)
	}

	const n = 1000
	code, out, errOut := runSinew(t, bin, "", "publish", "--addr", a.addr, "--topic", "two", "--count", strconv.Itoa(n))
	if code != 0 || out != fmt.Sprintf("published to two: confirmed %d, failed 0\n", n) {
		t.Fatalf("publish to the first broker: exit %d, out %q, err %q", code, out, errOut)
	}
	// A second try while the first has a queue changes nothing either.
	if code, _, errOut := runSinew(t, bin, "", "serve", "--data-dir", dir, "--listen", "127.0.0.1:0"); code != 1 ||
		!strings.Contains(errOut, fmt.Sprintf("(pid %d)", pid)) {
		t.Fatalf("third serve: exit %d, stderr %q", code, errOut)
	}
	stopChild(t, a)

	ready, quarantined := queueCounts(t, dir)
	if ready["two"] != n || quarantined != 0 {
		t.Fatalf("after restart: %d ready, %d quarantined partitions; want exactly %d and 0", ready["two"], quarantined, n)
	}
}

// TestTakenPortWithQuarantineIgnore: serve runs no recovery unless it owns
// the data dir and both ports, so a failed start never cuts or rewrites a
// log, even with storage.quarantine = ignore.
func TestTakenPortWithQuarantineIgnore(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	other := t.TempDir() // a second data dir, with data of its own
	o := startChild(t, bin, other)
	if code, out, errOut := runSinew(t, bin, "", "publish", "--addr", o.addr, "--topic", "other", "--count", "100"); code != 0 {
		t.Fatalf("publish: exit %d, %q %q", code, out, errOut)
	}
	stopChild(t, o)
	// A torn tail, which any recovery cuts off: a serve that ran recovery on
	// this dir would change its log file.
	segs, err := filepath.Glob(filepath.Join(other, "queues", "*", "*", "p*", "log", "*.seg"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segment in %s (%v)", other, err)
	}
	for _, name := range segs {
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.Write([]byte{0xde, 0xad, 0xbe})
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	a := startChildArgs(t, bin, dir, "--storage-quarantine", "ignore")
	const n = 3000
	code, out, errOut := runSinew(t, bin, "", "publish", "--addr", a.addr, "--topic", "kept", "--count", strconv.Itoa(n), "--window", "256")
	if code != 0 || out != fmt.Sprintf("published to kept: confirmed %d, failed 0\n", n) {
		t.Fatalf("publish: exit %d, out %q, err %q", code, out, errOut)
	}

	// Same dir, A's port: refused by the lock before anything is read.
	code, _, errOut = runSinew(t, bin, "", "serve", "--data-dir", dir, "--listen", a.addr, "--admin-listen", "",
		"--storage-quarantine", "ignore")
	if code != 1 || !strings.Contains(errOut, fmt.Sprintf("(pid %d)", a.cmd.Process.Pid)) {
		t.Fatalf("serve on the live dir and port: exit %d, stderr %q", code, errOut)
	}

	// Another dir, A's port taken: fails on the port, before recovery, and
	// leaves that dir as it was.
	before := snapshotDir(t, other)
	code, _, errOut = runSinew(t, bin, "", "serve", "--data-dir", other, "--listen", a.addr, "--admin-listen", "",
		"--storage-quarantine", "ignore")
	if code != 1 || !strings.Contains(errOut, "address already in use") || strings.Contains(errOut, "broker recovered") {
		t.Fatalf("serve on a taken port: exit %d, stderr %q; want a listen error and no recovery", code, errOut)
	}
	if after := snapshotDir(t, other); !maps.Equal(before, after) {
		t.Fatalf("a serve that failed to bind changed its data dir:\nbefore %v\nafter  %v", before, after)
	}
	// Its admin port taken (held by a listener here): the same.
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	code, _, errOut = runSinew(t, bin, "", "serve", "--data-dir", other, "--listen", "127.0.0.1:0",
		"--admin-listen", held.Addr().String(), "--storage-quarantine", "ignore")
	if code != 1 || !strings.Contains(errOut, "admin listen:") || strings.Contains(errOut, "broker recovered") {
		t.Fatalf("serve on a taken admin port: exit %d, stderr %q", code, errOut)
	}
	if after := snapshotDir(t, other); !maps.Equal(before, after) {
		t.Fatal("a serve that failed to bind its admin port changed its data dir")
	}

	stopChild(t, a)
	for d, want := range map[string]map[string]int{dir: {"kept": n}, other: {"other": 100}} {
		ready, quarantined := queueCounts(t, d)
		if !maps.Equal(ready, want) || quarantined != 0 {
			t.Fatalf("%s after restart: ready %v, %d quarantined; want %v and none", d, ready, quarantined, want)
		}
	}
}

// TestCLIBadInput runs the client commands as a user would, against a real
// broker process.
func TestCLIBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	a := startChild(t, bin, t.TempDir())
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"consume", "--addr", a.addr, "--topic", "t", "--prefetch", "4294967297"},
			"sinew consume: usage: --prefetch 4294967297 is out of range [0, 1048576]\n"},
		{[]string{"publish", "--addr", a.addr, "--topic", "t", "--window", "4294967297"},
			"sinew publish: usage: --window 4294967297 is out of range [1, 65536]\n"},
		{[]string{"publish", "--addr", a.addr, "--topic", "t", "--size", "-1"},
			"sinew publish: usage: --size -1 is out of range [0, 1048576]\n"},
	} {
		if code, out, errOut := runSinew(t, bin, "", c.args...); code != 2 || out != "" || errOut != c.want {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, out, errOut, c.want)
		}
	}

	// An over-long stdin line: the summary of what was stored, then the error.
	long := strings.Repeat("x", 1<<20+1)
	code, out, errOut := runSinew(t, bin, "one\ntwo\n"+long+"\nthree\n", "publish", "--addr", a.addr, "--topic", "cli")
	if code != 1 || out != "published to cli: confirmed 2, failed 0\n" ||
		!strings.HasPrefix(errOut, "sinew publish: stdin line 3: line too long") {
		t.Fatalf("long line: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// With --json the summary is on stderr and stdout is JSON lines only.
	code, out, errOut = runSinew(t, bin, "four\n", "publish", "--addr", a.addr, "--topic", "cli", "--json")
	if code != 0 || !strings.HasPrefix(out, `{"seq":1,`) || strings.Count(out, "\n") != 1 ||
		errOut != "published to cli: confirmed 1, failed 0\n" {
		t.Fatalf("--json: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = runSinew(t, bin, "", "consume", "--addr", a.addr, "--topic", "cli", "--count", "3")
	if code != 0 || out != "one\ntwo\nfour\n" {
		t.Fatalf("consume: exit %d, stdout %q, stderr %q; want the 3 stored messages", code, out, errOut)
	}
	stopChild(t, a)
}
