package harness

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// fakeBrokerEnv makes the test binary act as a minimal broker: it answers
// HELLO with HELLO_OK on the --listen address and exits 0 on SIGTERM. That lets
// the process control be tested without the real broker.
const fakeBrokerEnv = "SINEW_HARNESS_FAKE_BROKER"

func TestMain(m *testing.M) {
	if os.Getenv(fakeBrokerEnv) == "1" {
		os.Exit(fakeBroker(os.Args))
	}
	os.Exit(m.Run())
}

func fakeBroker(args []string) int {
	var addr string
	for i, a := range args {
		if a == "--listen" && i+1 < len(args) {
			addr = args[i+1]
		}
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake broker:", err)
		return 3
	}
	fmt.Fprintln(os.Stderr, "fake broker: listening on", addr)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, _, err := protocol.ReadFrame(c, protocol.FrameBytesDefault, nil); err != nil {
					return
				}
				_, _ = c.Write(protocol.AppendFrame(nil, 0, 1, &protocol.HelloOK{ProtocolVersion: 1}))
			}()
		}
	}()
	<-term
	fmt.Fprintln(os.Stderr, "fake broker: drained")
	return 0
}

func newFake(t *testing.T) *Broker {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b, err := New(Config{
		Binary:       self,
		DataDir:      filepath.Join(dir, "data"),
		Env:          []string{fakeBrokerEnv + "=1"},
		ReadyTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestLifecycle(t *testing.T) {
	b := newFake(t)
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Start = %v, want ErrRunning", err)
	}
	if err := b.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := Probe(b.Addr(), 200*time.Millisecond); err == nil {
		t.Fatal("a stopped broker answered HELLO")
	}
	if err := b.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitReady(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.Kill(); err != nil {
		t.Fatal(err)
	}
	if b.Running() {
		t.Fatal("running after Kill")
	}
	if err := b.Kill(); err != nil {
		t.Fatalf("Kill of a dead broker = %v, want nil", err)
	}
	if err := b.Pause(); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Pause of a dead broker = %v, want ErrNotRunning", err)
	}
	if err := b.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := b.Term(5 * time.Second); err != nil {
		t.Fatalf("Term = %v", err)
	}
	if b.Starts() != 2 {
		t.Fatalf("starts = %d, want 2", b.Starts())
	}
	tail := b.StderrTail()
	for _, want := range []string{"start #1", "start #2", "signal: killed", "fake broker: drained", "exit status 0"} {
		if !strings.Contains(tail, want) {
			t.Fatalf("stderr tail lacks %q:\n%s", want, tail)
		}
	}
}

func TestStartFailureReportsExit(t *testing.T) {
	b := newFake(t)
	// Occupy the port so the fake broker cannot listen and exits with 3.
	l, err := net.Listen("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = b.Start()
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("Start = %v, want ErrNotReady with exit status 3", err)
	}
}

func TestFileTailBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	var s strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&s, "line %d\n", i)
	}
	if err := os.WriteFile(p, []byte(s.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	tail := fileTail(p, 100)
	if !strings.HasPrefix(tail, "...\nline ") || !strings.HasSuffix(tail, "line 4999\n") || len(tail) > 104 {
		t.Fatalf("tail = %q", tail)
	}
}

func TestTmpfsFillAndFree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "mnt")
	unmount, err := MountTmpfs(dir, 1<<20)
	if errors.Is(err, ErrMountNotPermitted) {
		t.Skipf("disk-full faults need permission to mount tmpfs: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unmount()
	path, n, err := FillDisk(dir, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	if free, _ := FreeBytes(dir); free != 0 || n > 1<<20 {
		t.Fatalf("after fill: %d free, %d written", free, n)
	}
	if err := os.WriteFile(filepath.Join(dir, "x"), []byte("y"), 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write on a full tmpfs = %v, want ENOSPC", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if free, _ := FreeBytes(dir); free < 512<<10 {
		t.Fatalf("after freeing: %d free", free)
	}
}
