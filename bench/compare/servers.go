package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sinewmq/sinew/bench/natsjs"
	"github.com/sinewmq/sinew/bench/rabbit"
	"github.com/sinewmq/sinew/internal/benchkit"
	"github.com/sinewmq/sinew/internal/benchkit/sinewadapter"
)

// Bounds on a broker process's life cycle.
const (
	readyTimeout = 90 * time.Second // RabbitMQ's first boot initialises its database
	stopTimeout  = 30 * time.Second
	pollEvery    = 100 * time.Millisecond
)

// server is one broker configuration the comparison starts, measures and stops.
// Every start uses a fresh data directory.
type server interface {
	// name is the configuration's column name, e.g. "nats-js-sync".
	name() string
	// start launches the broker in dir (empty, owned by the caller) and returns
	// once it accepts clients.
	start(ctx context.Context, dir string) error
	// pid is the process whose RSS and CPU are the broker's.
	pid() int
	broker() benchkit.Broker
	// stop ends what start launched, and nothing else.
	stop() error
}

// proc is a child process started by the comparison. Its output goes to a log
// file in the data directory, and it runs in its own process group so a Ctrl-C
// meant for the comparison reaches it only through stop.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  *os.File
}

func startProc(dir, logName string, env []string, bin string, args ...string) (*proc, error) {
	lf, err := os.Create(filepath.Join(dir, logName))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), log: lf}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// terminate sends SIGTERM to the process it started, then SIGKILL if it has not
// exited within stopTimeout.
func (p *proc) terminate() error {
	if p == nil || p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s did not stop within %v of SIGTERM; killed", p.cmd.Path, stopTimeout)
}

// waitReady polls until addr accepts TCP connections and ready (if set) succeeds,
// the process exits, or readyTimeout passes.
func waitReady(ctx context.Context, p *proc, addr string, ready func(context.Context) error) error {
	deadline := time.Now().Add(readyTimeout)
	var last error
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("exited during start-up: %v (see its log)", p.err)
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			if ready == nil {
				return nil
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = ready(rctx)
			cancel()
			if err == nil {
				return nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollEvery):
		}
	}
	return fmt.Errorf("not ready on %s after %v: %v", addr, readyTimeout, last)
}

// freePort asks the kernel for an unused loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ---- Sinew ----

type sinewServer struct {
	bin   string
	args  string // extra serve flags, space-separated
	p     *proc
	addr  string
	pprof string // loopback address of the profiling endpoints (SINEW_PPROF_LISTEN)
}

func (s *sinewServer) name() string { return "sinew" }

func (s *sinewServer) start(ctx context.Context, dir string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	admin, err := freePort()
	if err != nil {
		return err
	}
	pp, err := freePort()
	if err != nil {
		return err
	}
	s.addr = "127.0.0.1:" + strconv.Itoa(port)
	s.pprof = "127.0.0.1:" + strconv.Itoa(pp)
	args := []string{"serve",
		"--data-dir", filepath.Join(dir, "data"),
		"--listen", s.addr,
		"--admin-listen", "127.0.0.1:" + strconv.Itoa(admin),
	}
	args = append(args, strings.Fields(s.args)...)
	env := []string{"SINEW_PPROF_LISTEN=" + s.pprof}
	if s.p, err = startProc(dir, "sinew.log", env, s.bin, args...); err != nil {
		return err
	}
	return waitReady(ctx, s.p, s.addr, func(ctx context.Context) error {
		c, err := s.broker().Connect(ctx)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func (s *sinewServer) pid() int                { return s.p.cmd.Process.Pid }
func (s *sinewServer) broker() benchkit.Broker { return sinewadapter.New(s.name(), s.addr) }
func (s *sinewServer) stop() error             { return s.p.terminate() }

// ---- NATS JetStream ----

type natsServer struct {
	bin  string
	sync bool // jetstream.sync_interval: always
	p    *proc
	url  string
}

func (s *natsServer) name() string {
	if s.sync {
		return "nats-js-sync"
	}
	return "nats-js"
}

func (s *natsServer) start(ctx context.Context, dir string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	syncLine := ""
	if s.sync {
		syncLine = "  sync_interval: always\n"
	}
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n%s}\n", port, filepath.Join(dir, "js"), syncLine)
	cf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return err
	}
	s.url = fmt.Sprintf("nats://127.0.0.1:%d", port)
	if s.p, err = startProc(dir, "nats.log", nil, s.bin, "-c", cf); err != nil {
		return err
	}
	return waitReady(ctx, s.p, fmt.Sprintf("127.0.0.1:%d", port), nil)
}

func (s *natsServer) pid() int                { return s.p.cmd.Process.Pid }
func (s *natsServer) broker() benchkit.Broker { return natsjs.New(s.name(), s.url) }
func (s *natsServer) stop() error             { return s.p.terminate() }

// ---- RabbitMQ ----

// rabbitServer runs a private RabbitMQ node: its own node name, ports, Erlang
// port mapper, cookie and data directories, so it neither sees nor disturbs a
// system RabbitMQ.
type rabbitServer struct {
	sbin    string // directory holding rabbitmq-server and rabbitmqctl
	p       *proc
	env     []string
	url     string
	epmd    int
	osPID   int
	dataDir string
}

func (s *rabbitServer) name() string { return "rabbitmq" }

func (s *rabbitServer) start(ctx context.Context, dir string) error {
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	amqpPort, distPort, epmdPort := ports[0], ports[1], ports[2]
	s.epmd = epmdPort
	s.dataDir = dir
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte("listeners.tcp.default = 127.0.0.1:"+strconv.Itoa(amqpPort)+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq-env.conf"), nil, 0o644); err != nil {
		return err
	}
	s.env = []string{
		"HOME=" + home, // the Erlang cookie lives here
		"RABBITMQ_NODENAME=sinewbench@localhost",
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(amqpPort),
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(distPort),
		"ERL_EPMD_PORT=" + strconv.Itoa(epmdPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE=" + filepath.Join(dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "rabbitmq.pid"),
	}
	s.url = fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", amqpPort)
	var err error
	if s.p, err = startProc(dir, "rabbitmq-server.log", s.env, filepath.Join(s.sbin, "rabbitmq-server")); err != nil {
		return err
	}
	if err := waitReady(ctx, s.p, fmt.Sprintf("127.0.0.1:%d", amqpPort), nil); err != nil {
		return err
	}
	// The broker's OS process is the Erlang VM; the pid file names it.
	b, err := os.ReadFile(filepath.Join(dir, "rabbitmq.pid"))
	if err != nil {
		return fmt.Errorf("rabbitmq pid file: %w", err)
	}
	if s.osPID, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return fmt.Errorf("rabbitmq pid file: %w", err)
	}
	return nil
}

func (s *rabbitServer) pid() int                { return s.osPID }
func (s *rabbitServer) broker() benchkit.Broker { return rabbit.New(s.name(), s.url) }

// stop asks the node to stop through rabbitmqctl, falls back to signals on the
// process it started, and then stops the private port mapper its node started.
func (s *rabbitServer) stop() error {
	if s.p == nil {
		return nil
	}
	var errs []error
	ctl := exec.Command(filepath.Join(s.sbin, "rabbitmqctl"), "stop")
	ctl.Env = append(os.Environ(), s.env...)
	if out, err := runBounded(ctl, stopTimeout); err != nil {
		errs = append(errs, fmt.Errorf("rabbitmqctl stop: %v: %s", err, out))
	}
	select {
	case <-s.p.done:
	case <-time.After(stopTimeout):
		errs = append(errs, s.p.terminate())
	}
	if s.osPID > 0 && s.osPID != s.p.cmd.Process.Pid {
		// The VM outlived its launcher script: stop it by its own pid.
		if err := syscall.Kill(s.osPID, 0); err == nil {
			_ = syscall.Kill(s.osPID, syscall.SIGTERM)
		}
	}
	epmd := exec.Command("epmd", "-port", strconv.Itoa(s.epmd), "-kill")
	epmd.Env = append(os.Environ(), "ERL_EPMD_PORT="+strconv.Itoa(s.epmd))
	_, _ = runBounded(epmd, 10*time.Second) // absent when the node never started one
	return errors.Join(errs...)
}

// runBounded runs cmd with a time limit and returns its combined output.
func runBounded(cmd *exec.Cmd, limit time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	c.Env, c.Dir = cmd.Env, cmd.Dir
	out, err := c.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
