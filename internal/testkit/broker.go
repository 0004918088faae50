package testkit

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/internal/session/bridge"
	"github.com/sinewmq/sinew/internal/vfs"
)

// shutdownTimeoutMs bounds the server drain in a StartBroker cleanup, so a
// stuck connection fails the test instead of hanging it.
const shutdownTimeoutMs = 10_000

// UserHashParams are the argon2id parameters of the passwords tests add to a
// StartBroker broker's users store: far cheaper than the defaults, so tests
// that log in many times stay fast under the race detector. Each hash
// records its parameters, so verification works the same as in production.
var UserHashParams = auth.HashParams{TimeCost: 1, MemoryKiB: 64, Threads: 1}

// Broker is an in-process Sinew broker behind the real wire server, listening
// on loopback. StartBroker returns it; the test's cleanup stops it.
type Broker struct {
	// Addr is the server's listening address ("127.0.0.1:port").
	Addr string
	// Server is the running wire server.
	Server *server.Server
	// Broker is the broker behind Server, or nil when WithBackend replaced it.
	Broker *broker.Broker
}

// BrokerOption adjusts what StartBroker runs.
type BrokerOption func(*brokerOptions)

type brokerOptions struct {
	dataDir string
	fs      vfs.FS
	backend session.Backend
	tunes   []func(*server.Config)
	// diskFails: the test makes the disk fail, so Close may report it.
	diskFails bool
}

// WithFailingDisk says the test makes the broker's disk fail: the node
// journal then fails for good, and the broker's Close reports it, which
// the harness logs instead of failing the test.
func WithFailingDisk() BrokerOption {
	return func(o *brokerOptions) { o.diskFails = true }
}

// WithDataDir keeps the broker's data under dir on the real file system (so
// every confirm waits for an fsync) instead of on an in-memory one.
func WithDataDir(dir string) BrokerOption {
	return func(o *brokerOptions) { o.dataDir = dir }
}

// WithFS keeps the broker's data on fs (under /data), so a test can inject
// faults with vfs.MemFS (SetSyncError, SetWriteError).
func WithFS(fs vfs.FS) BrokerOption {
	return func(o *brokerOptions) { o.fs = fs }
}

// WithBackend serves backend instead of opening a broker; Broker.Broker is
// then nil and the caller owns the backend's lifetime.
func WithBackend(backend session.Backend) BrokerOption {
	return func(o *brokerOptions) { o.backend = backend }
}

// WithServerConfig lets tune edit the server configuration before the server
// is built (auth tokens, grace, in-flight limits). A nil tune is ignored.
func WithServerConfig(tune func(*server.Config)) BrokerOption {
	return func(o *brokerOptions) {
		if tune != nil {
			o.tunes = append(o.tunes, tune)
		}
	}
}

// StartBroker opens a broker (on an in-memory file system unless WithDataDir
// says otherwise), serves it with the wire server on 127.0.0.1:0, and
// registers a cleanup that shuts the server down, checks that Serve ended
// with server.ErrServerClosed, and closes the broker, reporting any failure
// through tb. The server's ids and tokens come from a deterministic counter.
func StartBroker(tb testing.TB, opts ...BrokerOption) *Broker {
	tb.Helper()
	var o brokerOptions
	for _, opt := range opts {
		opt(&o)
	}
	var b *broker.Broker
	backend := o.backend
	if backend == nil {
		bcfg := broker.Config{DataDir: "/data", FS: vfs.NewMem()}
		if o.fs != nil {
			bcfg.FS = o.fs
		}
		if o.dataDir != "" {
			bcfg = broker.Config{DataDir: o.dataDir}
		}
		bcfg.UserHashParams = UserHashParams
		var err error
		if b, err = broker.Open(bcfg); err != nil {
			tb.Fatal(err)
		}
		backend = bridge.New(b)
	}
	cfg := server.Config{Backend: backend, OwnerID: "owner-test", Rand: &countingRand{}, ServerVersion: "test"}
	if b != nil {
		cfg.Users = b.Users()
	}
	for _, tune := range o.tunes {
		tune(&cfg)
	}
	closeBroker := func() {
		if b == nil {
			return
		}
		if err := b.Close(); err != nil {
			if o.diskFails {
				tb.Logf("broker close after the disk failed: %v", err)
				return
			}
			tb.Errorf("broker close: %v", err)
		}
	}
	srv, err := server.New(cfg)
	if err != nil {
		closeBroker()
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		closeBroker()
		tb.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeoutMs*time.Millisecond)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			tb.Errorf("server shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, server.ErrServerClosed) {
			tb.Errorf("serve: %v", err)
		}
		closeBroker()
	})
	return &Broker{Addr: ln.Addr().String(), Server: srv, Broker: b}
}

// countingRand is a deterministic io.Reader for the server's ids and tokens:
// it yields 1, 2, 3, ... (wrapping), so runs are reproducible.
type countingRand struct {
	mu sync.Mutex
	n  byte
}

func (r *countingRand) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range p {
		r.n++
		p[i] = r.n
	}
	return len(p), nil
}
