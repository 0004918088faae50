package e2e_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// buildSinew compiles the sinew binary into a temporary directory.
func buildSinew(t testing.TB) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "sinew")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/sinewmq/sinew/cmd/sinew")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// child is a running `sinew serve` process.
type child struct {
	cmd  *exec.Cmd
	addr string
	logs *strings.Builder
	mu   *sync.Mutex
	done chan struct{} // stderr drained
}

// startChild runs `sinew serve` on dir and waits for its "serving" log line.
func startChild(t testing.TB, bin, dir string) *child {
	t.Helper()
	return startChildArgs(t, bin, dir)
}

// startChildArgs is startChild with extra serve flags (later flags win).
func startChildArgs(t testing.TB, bin, dir string, extra ...string) *child {
	t.Helper()
	args := append([]string{"serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--admin-listen", ""}, extra...)
	return startCommand(t, bin, args...)
}

// startCommand runs name with args, a command that ends up as `sinew
// serve` (directly, or under ip netns exec), and waits for its "serving"
// log line.
func startCommand(t testing.TB, name string, args ...string) *child {
	t.Helper()
	cmd := exec.Command(name, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, logs: &strings.Builder{}, mu: &sync.Mutex{}, done: make(chan struct{})}
	addrc := make(chan string, 1)
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.logs.WriteString(line + "\n")
			c.mu.Unlock()
			if strings.Contains(line, "msg=serving") {
				for f := range strings.FieldsSeq(line) {
					if a, ok := strings.CutPrefix(f, "listen="); ok {
						addrc <- a
					}
				}
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	select {
	case c.addr = <-addrc:
	case <-c.done:
		cmd.Wait()
		t.Fatalf("sinew serve exited before serving:\n%s", c.log())
	case <-time.After(safetyTimeout):
		t.Fatalf("sinew serve did not start:\n%s", c.log())
	}
	return c
}

func (c *child) log() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.logs.String()
}

// TestCrashKeepsConfirmedPublishes kill -9s a real broker process in the middle of
// a stream of pipelined publishes and checks, after a restart on the same data
// directory, that every publish it had confirmed is there.
func TestCrashKeepsConfirmedPublishes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	crashKeepsConfirmed(t, bin)
}

func crashKeepsConfirmed(t *testing.T, bin string, extra ...string) {
	dir := t.TempDir()
	srv := startChildArgs(t, bin, dir, extra...)

	const total, killAfter = 20_000, 2_000
	nc, err := net.Dial("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &client{t: t, nc: nc, br: bufio.NewReader(nc)}
	c.send(0, &protocol.Hello{ProtocolVersion: protocol.Version})
	expect[*protocol.HelloOK](c)

	// Writer: pipelined publishes, request id i+1 carries body "m-i". It stops at
	// the first write error (the broker is gone).
	go func() {
		buf := make([]byte, 0, 64<<10)
		for i := range total {
			buf = protocol.AppendFrame(buf, 0, uint64(i+1), &protocol.Publish{Topic: "crash", Partition: -1, Body: fmt.Appendf(nil, "m-%d", i)})
			if len(buf) >= 32<<10 || i == total-1 {
				if _, err := nc.Write(buf); err != nil {
					return
				}
				buf = buf[:0]
			}
		}
	}()
	// Reader: collect confirms; kill -9 the broker once killAfter are in.
	confirmed := map[string]bool{}
	killed := false
	for {
		nc.SetReadDeadline(time.Now().Add(safetyTimeout))
		f, _, err := protocol.ReadFrame(c.br, 1<<24, nil)
		if err != nil {
			if !killed {
				t.Fatalf("connection failed before the kill: %v\n%s", err, srv.log())
			}
			break
		}
		switch f.Op {
		case protocol.OpPublishOK:
			confirmed[fmt.Sprintf("m-%d", f.RequestID-1)] = true
		case protocol.OpPing:
		default:
			b, _ := protocol.Decode(f)
			t.Fatalf("unexpected %s %+v", f.Op, b)
		}
		if !killed && len(confirmed) >= killAfter {
			if err := srv.cmd.Process.Kill(); err != nil { // SIGKILL
				t.Fatal(err)
			}
			killed = true
		}
		if len(confirmed) == total {
			t.Fatal("every publish was confirmed before the kill took effect; nothing was tested")
		}
	}
	// Read stderr to its end before Wait, which closes the pipe (os/exec).
	<-srv.done
	srv.cmd.Wait()
	t.Logf("%d of %d publishes confirmed before kill -9", len(confirmed), total)

	// Restart on the same directory and drain the queue.
	srv2 := startChildArgs(t, bin, dir, extra...)
	d := dial(t, srv2.addr)
	d.subscribe(&protocol.Subscribe{Topic: "crash", Partition: -1, Prefetch: 1000})
	seen := map[string]bool{}
	missing := len(confirmed)
	for missing > 0 {
		m := d.next()
		key := string(m.Body)
		if !seen[key] {
			seen[key] = true
			if confirmed[key] {
				missing--
			}
		}
		d.send(protocol.FlagNoReply, &protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{m.Tag}})
	}
	t.Logf("after restart: all %d confirmed publishes present (%d distinct messages read)", len(confirmed), len(seen))
	if err := srv2.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv2.done: // stderr read to its end: the process closed it on exit
	case <-time.After(safetyTimeout):
		t.Fatalf("sinew serve did not exit after SIGINT:\n%s", srv2.log())
	}
	if err := srv2.cmd.Wait(); err != nil {
		t.Fatalf("sinew serve after SIGINT: %v\n%s", err, srv2.log())
	}
	if !strings.Contains(srv2.log(), "drained") {
		t.Fatalf("no drain on SIGINT:\n%s", srv2.log())
	}
	if len(extra) > 0 {
		// The clean stop retired the WAL: the directory now starts
		// without it.
		srv3 := startChild(t, bin, dir)
		if err := srv3.cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		if status := waitChild(t, srv3); status != 0 {
			t.Fatalf("serve without the WAL after a clean stop exited %d:\n%s", status, srv3.log())
		}
	}
}
