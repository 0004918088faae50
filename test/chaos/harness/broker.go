package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// Limits on waits, so that a hung broker fails a test instead of hanging it.
const (
	readyTimeoutDefault = 20 * time.Second
	probeTimeout        = 2 * time.Second
	probeIntervalMs     = 50
	exitTimeoutDefault  = 15 * time.Second
	stderrTailBytesMax  = 16 << 10
	stopWaitPolls       = 400 // with stopWaitPollMs: 2 s for SIGSTOP to take effect
	stopWaitPollMs      = 5
)

// Errors returned by Broker methods.
var (
	// ErrNotRunning is returned when a signal is sent to a broker that has exited.
	ErrNotRunning = errors.New("harness: broker is not running")
	// ErrRunning is returned by Start when the broker is already running.
	ErrRunning = errors.New("harness: broker is already running")
	// ErrNotReady is returned when the broker does not answer HELLO in time.
	ErrNotReady = errors.New("harness: broker did not become ready")
	// ErrExitTimeout is returned when the broker did not exit in time after a signal.
	ErrExitTimeout = errors.New("harness: broker did not exit in time")
)

// Config describes one broker. Zero fields take defaults.
type Config struct {
	// Binary is the sinew executable (see Build).
	Binary string
	// DataDir is the broker's data directory; it survives restarts.
	DataDir string
	// LogDir receives broker.stderr; defaults to DataDir's parent.
	LogDir string
	// Addr and AdminAddr are the client and admin listen addresses; empty
	// means a free loopback port, picked once and kept across restarts.
	Addr, AdminAddr string
	// Args builds the command line from the broker; defaults to ServeArgs.
	Args func(b *Broker) []string
	// ExtraArgs are appended to ServeArgs (broker settings as flags).
	ExtraArgs []string
	// Env is added to the child's environment.
	Env []string
	// Wrap, when set, is a command prefix the broker runs under, such as
	// `ip netns exec NS` to run it in a network namespace. The prefix must
	// exec the binary in place, so that signals reach the broker.
	Wrap []string
	// Dial opens the connections of the readiness probe and of DialContext
	// (net.Dialer's by default): a broker in another network namespace is
	// reached from inside it.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Credentials go in the HELLO of the readiness probe, for a broker with
	// authentication configured; empty sends none.
	Credentials string
	// ReadyTimeout bounds the wait for the first HELLO_OK after a start.
	ReadyTimeout time.Duration
	// ExitTimeout bounds the wait for the process to exit after SIGTERM or SIGKILL.
	ExitTimeout time.Duration
}

// ServeArgs is the default command line: `sinew serve` with the broker's data
// directory and listen addresses, then Config.ExtraArgs.
func ServeArgs(b *Broker) []string {
	return append([]string{"serve",
		"--data-dir", b.cfg.DataDir,
		"--listen", b.cfg.Addr,
		"--admin-listen", b.cfg.AdminAddr,
	}, b.cfg.ExtraArgs...)
}

// Broker is one broker identity (data dir, ports) across any number of
// process starts.
type Broker struct {
	cfg        Config
	stderrPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	exit   error         // cmd.Wait's result, valid once exited is closed
	starts int
}

// New prepares a broker without starting it. Free ports are picked now and kept
// for the broker's life, so clients and proxies can keep one address across
// restarts.
func New(cfg Config) (*Broker, error) {
	if cfg.Binary == "" || cfg.DataDir == "" {
		return nil, errors.New("harness: Config needs Binary and DataDir")
	}
	if cfg.LogDir == "" {
		cfg.LogDir = filepath.Dir(cfg.DataDir)
	}
	if cfg.Args == nil {
		cfg.Args = ServeArgs
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = readyTimeoutDefault
	}
	if cfg.ExitTimeout <= 0 {
		cfg.ExitTimeout = exitTimeoutDefault
	}
	for _, a := range []*string{&cfg.Addr, &cfg.AdminAddr} {
		if *a == "" {
			p, err := FreeAddr()
			if err != nil {
				return nil, err
			}
			*a = p
		}
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("harness: data dir: %w", err)
	}
	if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("harness: log dir: %w", err)
	}
	closed := make(chan struct{})
	close(closed)
	return &Broker{
		cfg:        cfg,
		stderrPath: filepath.Join(cfg.LogDir, "broker.stderr"),
		exited:     closed,
		exit:       ErrNotRunning,
	}, nil
}

// FreeAddr returns a loopback address whose port was free a moment ago,
// picked at random below the kernel's ephemeral range (Linux's default
// starts at 32768): a broker restarted on the same ports must find them
// free again, and a port from the ephemeral range can be taken meanwhile as
// the local end of any outgoing connection on the machine.
func FreeAddr() (string, error) {
	for range freePortTries {
		port := freePortMin + rand.IntN(freePortMax-freePortMin)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken: another
		}
		l.Close()
		return l.Addr().String(), nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("harness: pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// The ports FreeAddr picks from, and how many it tries before it takes
// one from the kernel.
const (
	freePortMin   = 20000
	freePortMax   = 32768
	freePortTries = 64
)

// Addr is the client listen address.
func (b *Broker) Addr() string { return b.cfg.Addr }

// AdminAddr is the admin HTTP listen address.
func (b *Broker) AdminAddr() string { return b.cfg.AdminAddr }

// DialContext opens a connection to addr the way the harness reaches the
// broker (Config.Dial), for a client of its listeners.
func (b *Broker) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return b.cfg.Dial(ctx, network, addr)
}

// DataDir is the broker's data directory.
func (b *Broker) DataDir() string { return b.cfg.DataDir }

// StderrPath is the file that collects the broker's stderr across starts.
func (b *Broker) StderrPath() string { return b.stderrPath }

// Starts counts process starts so far.
func (b *Broker) Starts() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.starts
}

// Start launches the broker process and waits until it answers HELLO. The
// process runs in its own process group and dies with the test binary.
func (b *Broker) Start() error {
	b.mu.Lock()
	select {
	case <-b.exited:
	default:
		b.mu.Unlock()
		return ErrRunning
	}
	f, err := os.OpenFile(b.stderrPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.mu.Unlock()
		return fmt.Errorf("harness: stderr file: %w", err)
	}
	b.starts++
	argv := append(append(slices.Clone(b.cfg.Wrap), b.cfg.Binary), b.cfg.Args(b)...)
	fmt.Fprintf(f, "=== harness: start #%d at %s: %s\n", b.starts,
		time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), b.cfg.Env...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		b.mu.Unlock()
		return fmt.Errorf("harness: start broker: %w", err)
	}
	exited := make(chan struct{})
	b.cmd, b.exited, b.exit = cmd, exited, nil
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(f, "=== harness: process %d exited: %v\n", cmd.Process.Pid, errOrZero(err))
		f.Close()
		b.mu.Lock()
		b.exit = err
		b.mu.Unlock()
		close(exited)
	}()
	b.mu.Unlock()
	return b.WaitReady(b.cfg.ReadyTimeout)
}

func errOrZero(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// WaitReady waits until the broker completes a HELLO handshake, the process
// exits, or timeout passes.
func (b *Broker) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	exited := b.exitedChan()
	var last error
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		select {
		case <-exited:
			return fmt.Errorf("%w: process exited (%v) before it answered HELLO", ErrNotReady, b.ExitErr())
		default:
		}
		if last = probe(b.cfg.Dial, b.cfg.Addr, b.cfg.Credentials, probeTimeout); last == nil {
			return nil
		}
		select {
		case <-exited:
		case <-time.After(probeIntervalMs * time.Millisecond):
		}
	}
	return fmt.Errorf("%w within %v: %v", ErrNotReady, timeout, last)
}

// Probe dials addr and completes a HELLO handshake within timeout.
func Probe(addr string, timeout time.Duration) error { return ProbeCredentials(addr, "", timeout) }

// ProbeCredentials is Probe with credentials in the HELLO.
func ProbeCredentials(addr, credentials string, timeout time.Duration) error {
	var d net.Dialer
	return probe(d.DialContext, addr, credentials, timeout)
}

func probe(dial func(ctx context.Context, network, addr string) (net.Conn, error), addr, credentials string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	hello := protocol.AppendFrame(nil, 0, 1, &protocol.Hello{ProtocolVersion: protocol.Version, ClientName: "chaos-probe", Credentials: credentials})
	if _, err := c.Write(hello); err != nil {
		return err
	}
	f, _, err := protocol.ReadFrame(bufio.NewReader(c), protocol.FrameBytesDefault, nil)
	if err != nil {
		return err
	}
	body, err := protocol.Decode(f)
	if err != nil {
		return err
	}
	switch m := body.(type) {
	case *protocol.HelloOK:
		return nil
	case *protocol.ErrorBody:
		return m.Err()
	default:
		return fmt.Errorf("harness: probe got %v, want HELLO_OK", f.Op)
	}
}

func (b *Broker) exitedChan() chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.exited
}

// Running reports whether the current process has not exited.
func (b *Broker) Running() bool {
	select {
	case <-b.exitedChan():
		return false
	default:
		return true
	}
}

// ExitErr is the last process's exit result (nil for a clean exit 0).
func (b *Broker) ExitErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.exit
}

// Pid is the current process id, or 0 when none is running.
func (b *Broker) Pid() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil || b.cmd.Process == nil {
		return 0
	}
	return b.cmd.Process.Pid
}

// signal sends sig to the broker's process group.
func (b *Broker) signal(sig syscall.Signal) error {
	if !b.Running() {
		return ErrNotRunning
	}
	pid := b.Pid()
	if err := syscall.Kill(-pid, sig); err != nil {
		return fmt.Errorf("harness: signal %v to group %d: %w", sig, pid, err)
	}
	return nil
}

// WaitExit waits up to timeout for the process to exit and returns its exit
// result, or ErrExitTimeout.
func (b *Broker) WaitExit(timeout time.Duration) error {
	select {
	case <-b.exitedChan():
		return b.ExitErr()
	case <-time.After(timeout):
		return fmt.Errorf("%w (%v)", ErrExitTimeout, timeout)
	}
}

// Kill sends SIGKILL to the process group (a crash: nothing is flushed) and
// waits for the exit. It is a no-op on a broker that is not running.
func (b *Broker) Kill() error {
	if err := b.signal(syscall.SIGKILL); err != nil {
		if errors.Is(err, ErrNotRunning) {
			return nil
		}
		return err
	}
	// SIGKILL cannot be caught, so the exit status says "signal: killed".
	if err := b.WaitExit(b.cfg.ExitTimeout); errors.Is(err, ErrExitTimeout) {
		return err
	}
	return nil
}

// Term sends SIGTERM (planned stop: the broker drains) and waits up to
// drainTimeout for the process to exit. A broker that does not exit in time is
// killed, and the error says so. A drain must end in exit status 0.
func (b *Broker) Term(drainTimeout time.Duration) error {
	if err := b.signal(syscall.SIGTERM); err != nil {
		return err
	}
	err := b.WaitExit(drainTimeout)
	if errors.Is(err, ErrExitTimeout) {
		kerr := b.Kill()
		return errors.Join(fmt.Errorf("harness: drain did not finish: %w", err), kerr)
	}
	if err != nil {
		return fmt.Errorf("harness: broker exited uncleanly after SIGTERM: %w", err)
	}
	return nil
}

// Pause sends SIGSTOP and returns once the kernel reports the process
// stopped: it freezes with its sockets open, as on a long GC pause, a VM
// migration or a swap storm.
func (b *Broker) Pause() error {
	if err := b.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	stat := fmt.Sprintf("/proc/%d/stat", b.Pid())
	for range stopWaitPolls {
		data, err := os.ReadFile(stat)
		if err != nil {
			return fmt.Errorf("harness: pause: %w", err)
		}
		// Format: pid (comm) state ...; comm may hold spaces, so cut at the last ')'.
		if i := bytes.LastIndexByte(data, ')'); i >= 0 && i+2 < len(data) && data[i+2] == 'T' {
			return nil
		}
		time.Sleep(stopWaitPollMs * time.Millisecond)
	}
	return fmt.Errorf("harness: process %d did not stop after SIGSTOP", b.Pid())
}

// Resume sends SIGCONT after Pause.
func (b *Broker) Resume() error { return b.signal(syscall.SIGCONT) }

// SetBinary makes every later start run path instead of Config.Binary: a
// node upgraded in place (stop it, SetBinary, Restart).
func (b *Broker) SetBinary(path string) {
	b.mu.Lock()
	b.cfg.Binary = path
	b.mu.Unlock()
}

// Restart starts the broker again on the same data dir and ports after the
// previous process exited (Kill or Term first).
func (b *Broker) Restart() error {
	if b.Running() {
		return ErrRunning
	}
	return b.Start()
}

// Close kills the process group if it is still running (SIGCONT first, in case
// it was paused). It is meant for t.Cleanup and is safe to call twice.
func (b *Broker) Close() error {
	if !b.Running() {
		return nil
	}
	_ = b.signal(syscall.SIGCONT)
	return b.Kill()
}

// StderrTail returns the last lines of the broker's stderr across every start,
// at most stderrTailBytesMax bytes.
func (b *Broker) StderrTail() string {
	return fileTail(b.stderrPath, stderrTailBytesMax)
}

func fileTail(path string, bytesMax int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no stderr: %v)", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(stderr: %v)", err)
	}
	off := st.Size() - bytesMax
	if off < 0 {
		off = 0
	}
	buf, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return fmt.Sprintf("(stderr: %v)", err)
	}
	if off > 0 {
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
		return "...\n" + string(buf)
	}
	return string(buf)
}
