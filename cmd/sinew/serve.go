package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/clusternode"
	"github.com/sinewmq/sinew/internal/dedup"
	"github.com/sinewmq/sinew/internal/nodeid"
	"github.com/sinewmq/sinew/internal/runtimesettings"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/internal/session/bridge"
	"github.com/sinewmq/sinew/internal/sessionstore"
	"github.com/sinewmq/sinew/internal/settings"
	"github.com/sinewmq/sinew/internal/tlsconf"
	"github.com/sinewmq/sinew/internal/vfs"
)

// serverVersion is announced in HELLO_OK.
const serverVersion = "sinew/0.1"

// ownerIDFile holds the broker's stable identity inside the data directory. Resume
// identities carry it, so a client that comes back after a restart is told
// "not found" (same broker, session gone) rather than "rejected" (another broker).
const ownerIDFile = "owner-id"

// sessionsDir holds the session store (internal/sessionstore) inside the data
// directory.
const sessionsDir = "sessions"

// adminShutdownMs bounds the admin HTTP server's shutdown.
const adminShutdownMs = 2000

// adminIdleTimeoutMs and adminHeaderBytesMax bound an admin HTTP peer's idle
// keep-alive connection and its request headers.
const (
	adminIdleTimeoutMs  = 60_000
	adminHeaderBytesMax = 64 << 10
)

func init() {
	commands["serve"] = command{
		summary: "run the broker (client protocol, admin HTTP) until SIGINT/SIGTERM",
		run:     runServe,
	}
}

func runServe(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
	fs := newFlagSet("serve", stderr)
	settings.RegisterFlags(fs)
	configPath := fs.String("config", os.Getenv("SINEW_CONFIG"), "TOML configuration `file` (env SINEW_CONFIG)")
	cluster := fs.Bool("cluster", false, "join a cluster: the same as --cluster-enabled (docs/cluster.md)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := settings.Load(settings.Sources{File: *configPath, Env: os.LookupEnv, Flags: fs})
	if err != nil {
		// A bad flag, variable or config value: nothing has started.
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *cluster {
		cfg.Cluster.Enabled = true
		if err := cfg.Validate(); err != nil {
			return err
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return fmt.Errorf("log_level: %w", err)
	}
	logger := newLogger(stderr, cfg.LogFormat, level)
	return serve(ctx, cfg, logger)
}

// serve runs the broker until ctx ends, SIGTERM/SIGINT arrives or the admin API
// asks for a drain; a cluster node first hands over the lead of every raft
// group it leads (HandOverForStop, bounded), and its GOING_AWAY names a node
// that stays up. Then it drains in two phases (see server.Shutdown): GOING_AWAY
// to every client, nothing new leased or accepted, settles and confirms still
// served until nothing is in flight or connection.drain_timeout_ms (a runtime
// setting, read when the drain starts) has passed;
// then connections flushed and closed, the broker checkpointed and closed, and
// serve returns nil (exit 0). A second SIGTERM/SIGINT during the drain exits
// the process at once with status exitAbandonedDrain: nothing is lost, since
// only what is durable was ever confirmed, and recovery at the next start
// treats it like a crash.
//
// Startup order matters for the data: the data dir's lock comes first, so no
// second broker reads or repairs a live broker's files; then both listeners are
// bound, so a taken port fails the command before recovery touches the log; only
// then does the broker open (recovery) and serve on the bound listeners. The
// admin listener answers during recovery already: /healthz 200, /readyz 503.
func serve(ctx context.Context, cfg settings.Config, logger *slog.Logger) error {
	// settings.Load checks the tokens too; checked again here, before
	// anything is locked or bound, so no caller can start a broker with a
	// guessable token.
	if err := auth.CheckTokens(cfg.Auth.Tokens); err != nil {
		return fmt.Errorf("refusing to start: %w", err)
	}
	lock, err := broker.LockDataDir(nil, cfg.DataDir)
	if err != nil {
		return err
	}
	// From here the lock belongs to whoever is to release it: this function
	// until broker.Open takes it over (and releases it on failure or Close).
	defer func() {
		if lock != nil {
			lock.Release()
		}
	}()
	tightenDataDir(cfg.DataDir, logger)
	owner, err := loadOwnerID(cfg.DataDir)
	if err != nil {
		return err
	}
	// The users store is read before anything listens: the startup rule
	// needs to know whether authentication is configured, and a damaged
	// store stops startup rather than open the broker to anyone.
	users, err := auth.OpenUsersWith(vfs.OS(), broker.UsersPath(cfg.DataDir), auth.UsersOptions{HashesMax: cfg.Auth.PasswordHashesMax})
	if err != nil {
		return err
	}
	if err := checkListenAuth(cfg, users, logger); err != nil {
		return err
	}
	if err := clusternode.CheckAuth(cfg, users.Len() > 0); err != nil {
		return err
	}
	// Runtime settings are read (or seeded) before anything listens, so a
	// corrupt document stops startup before a client can connect.
	rt, err := runtimesettings.Open(vfs.OS(), cfg.DataDir, cfg.Seed(), logger.With("component", "settings"))
	if err != nil {
		return err
	}
	var tlsr tlsReloaders
	var ln net.Listener
	ln, tlsr.client, err = clientListener(cfg, logger)
	if err != nil {
		return err
	}
	tlsr.clientLn, _ = ln.(*tlsconf.Listener)
	var aln net.Listener
	var gate *admin.Gate
	if cfg.AdminListen != "" {
		if gate, err = adminGate(cfg, users, logger); err != nil {
			ln.Close()
			return err
		}
		if aln, tlsr.admin, err = adminListener(cfg, ln.Addr().String(), logger); err != nil {
			ln.Close()
			return err
		}
	}
	// Certificates reload from here on, recovery included: a rotation
	// during a long recovery is not missed.
	stopReload := watchTLSReload(tlsr, cfg.TLS.ReloadPollMs, logger.With("component", "tls"))
	defer stopReload()
	closeListeners := func() {
		ln.Close()
		if aln != nil {
			aln.Close()
		}
	}
	// The gossip port is bound before recovery too, so that a taken port
	// fails the command before the log is touched.
	var cn *clusternode.Node
	if cfg.Cluster.Enabled {
		if cn, err = clusternode.Start(cfg, ln.Addr().String(), logger.With("component", "cluster")); err != nil {
			closeListeners()
			return err
		}
		defer cn.Close()
	}

	// The admin listener answers from the start: /healthz 200 and /readyz 503
	// while the broker recovers, so probes see a live, unready process rather
	// than a connection that hangs. The full handler replaces it once the
	// broker and the server exist.
	errc := make(chan error, 2)
	var adminSrv *http.Server
	var adminHandler atomic.Pointer[http.Handler]
	adminAddr := ""
	if aln != nil {
		adminAddr = aln.Addr().String()
		recovering := gate.Wrap(admin.Recovering())
		adminHandler.Store(&recovering)
		adminSrv = &http.Server{ReadHeaderTimeout: 10 * time.Second,
			// Bounds on what one HTTP peer can hold: an idle keep-alive
			// connection is closed after a minute, a request's headers are
			// at most 64 KiB; admin.LimitListener bounds the connections.
			IdleTimeout: adminIdleTimeoutMs * time.Millisecond, MaxHeaderBytes: adminHeaderBytesMax,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*adminHandler.Load()).ServeHTTP(w, r) }),
			// net/http reports every failed TLS handshake and bad request
			// here; any peer can cause one, so they go to the broker's log
			// at debug, not to stderr where a flood would drown the rest.
			ErrorLog: slog.NewLogLogger(logger.With("component", "admin_http").Handler(), slog.LevelDebug)}
		go func() {
			if err := adminSrv.Serve(aln); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("admin: %w", err)
			}
		}()
	}
	if serveRecoveringHook != nil {
		serveRecoveringHook(adminAddr)
	}

	sync := seglog.SyncAlways
	if cfg.Storage.Sync == "interval" {
		sync = seglog.SyncInterval
	}
	quarantine := map[string]broker.QuarantinePolicy{"quarantine": broker.Quarantine, "refuse": broker.Refuse, "ignore": broker.Ignore}[cfg.Storage.Quarantine]
	start := time.Now()
	restartGrace := rt.Int(runtimesettings.KeyRestartGraceMs)
	sm := newSyncMetrics()
	held := lock
	lock = nil                 // broker.Open owns it now, failed or not
	var cluster broker.Cluster // nil interface on a single node
	if cn != nil {
		cluster = cn
	}
	b, err := broker.Open(broker.Config{
		Cluster: cluster,
		DataDir: cfg.DataDir, Lock: held, Now: time.Now, Logger: logger.With("component", "broker"), Users: users,
		DefaultPartitions: cfg.Queue.Partitions, DefaultLeaseMs: cfg.Queue.LeaseMs, DefaultMaxRetries: cfg.Queue.MaxRetries,
		DeadLetterTopic: cfg.Queue.DeadLetterTopic,
		DelayMsMax:      cfg.Queue.DelayMsMax, TTLMsMax: cfg.Queue.TTLMsMax, NackDelayMsMax: cfg.Queue.NackDelayMsMax,
		Sync: sync, SyncIntervalMs: cfg.Storage.SyncIntervalMs, OnSync: sm.observe,
		SegmentBytes: cfg.Storage.SegmentBytes, Quarantine: quarantine, InboxMax: cfg.Storage.InboxMax,
		BodyBytesMax: cfg.Limits.BodyBytesMax, PrefetchMax: cfg.Limits.PrefetchMax,
		CheckpointEveryRecords: cfg.Storage.CheckpointEveryRecords,
		BodyCacheBytes:         bodyCacheBytes(cfg.Storage.BodyCacheBytes),
		RaftCacheBytes:         int(cfg.Storage.RaftCacheBytes),
		// A client may have publish_inflight_max publishes unconfirmed, all
		// resent after a break: the window must reach back that far.
		Dedup: dedup.Config{WindowSeqs: max(dedup.WindowSeqsDefault, cfg.Limits.PublishInflightMax),
			EntriesMax:   max(dedup.EntriesMaxDefault, cfg.Limits.PublishInflightMax),
			ProducersMax: cfg.Limits.DedupProducersMax, IdleMs: cfg.Limits.DedupIdleMs},
		QueuesMax: cfg.Limits.QueuesMax, QueuePartitionsMax: cfg.Limits.QueuePartitionsMax,
		PartitionsTotalMax: cfg.Limits.PartitionsTotalMax,
		// Recovered leases wait as long as the sessions restored to take
		// them back; the rest go to ready when the window ends.
		RecoveredLeaseGraceMs: restartGrace,
	})
	if err != nil {
		closeListeners()
		return fmt.Errorf("open broker: %w", err)
	}
	logger.Info("broker recovered", "data_dir", cfg.DataDir, "owner_id", owner, "took_ms", time.Since(start).Milliseconds())
	if cn != nil {
		cn.ReportLoad(b)
		defer cn.ReportLoad(nil)
		rt.SetCommitter(cn.CommitRuntime)
		syncCtx, stopSync := context.WithCancel(context.Background())
		syncDone := make(chan struct{})
		go func() {
			defer close(syncDone)
			cn.SyncCatalogue(syncCtx, b, rt)
		}()
		defer func() {
			stopSync()
			<-syncDone
		}()
	}
	defer func() {
		// Close writes every partition's checkpoint: the last step of a drain.
		if err := b.Close(); err != nil {
			logger.Error("broker close", "err", err)
			return
		}
		logger.Info("broker closed and checkpointed")
	}()

	store, err := sessionstore.Open(sessionstore.Options{Dir: filepath.Join(cfg.DataDir, sessionsDir), Logger: logger.With("component", "sessions")})
	if err != nil {
		closeListeners()
		return fmt.Errorf("open session store: %w", err)
	}
	defer func() {
		if err := store.Close(); err != nil {
			logger.Error("session store close", "err", err)
		}
	}()

	// goingAwayRedirect is set by the planned stop's handover, before the
	// drain sends GOING_AWAY (a cluster node only).
	goingAwayRedirect := ""
	var redirect func() string
	if cn != nil {
		redirect = func() string { return goingAwayRedirect }
	}
	srv, err := server.New(server.Config{
		Cluster: cn != nil, Redirect: redirect,
		SessionStore: store, RestartGraceMs: restartGrace, RestartGraceMsNext: func() int64 { return rt.Int(runtimesettings.KeyRestartGraceMs) },
		Backend: bridge.New(b), OwnerID: owner, Rand: rand.Reader, ServerVersion: serverVersion,
		Logger: logger.With("component", "server"), AuthTokens: cfg.Auth.Tokens, Users: users, AllowAnonymous: cfg.Auth.AllowAnonymous,
		FrameBytesMax: cfg.Limits.FrameBytesMax, BodyBytesMax: cfg.Limits.BodyBytesMax,
		PrefetchDefault: uint32(cfg.Limits.PrefetchDefault), PrefetchMax: uint32(cfg.Limits.PrefetchMax),
		SettleBatchMax: cfg.Limits.SettleBatchMax, LeaseMsMax: cfg.Queue.LeaseMsMax, PublishInflightMax: cfg.Limits.PublishInflightMax,
		SubscriptionsMax: cfg.Limits.SubscriptionsMax, ConnectionsMax: cfg.Limits.ConnectionsMax,
		ConnectionsPerAddressMax: cfg.Limits.ConnectionsPerAddressMax, HandshakesMax: cfg.Limits.HandshakesMax,
		HandshakeTimeoutMs: cfg.Connection.HandshakeTimeoutMs, HeartbeatMs: heartbeat(cfg.Connection.HeartbeatMs),
		WriteTimeoutMs:       cfg.Connection.WriteTimeoutMs,
		ReconnectGraceMsLive: func() int64 { return rt.Int(runtimesettings.KeyReconnectGraceMs) },
		OutboundBytesMax:     cfg.Limits.OutboundBytesMax, ResendBytesMax: cfg.Limits.ResendBytesMax,
		DormantSessionsMax: cfg.Limits.DormantSessionsMax, AfterFunc: serveAfterFunc, SlowConsumerTimeoutMs: cfg.Connection.SlowConsumerTimeoutMs,
	})
	if err != nil {
		closeListeners()
		return err
	}
	drain := &drainer{timeoutMs: func() int64 { return rt.Int(runtimesettings.KeyDrainTimeoutMs) }, started: make(chan struct{})}
	stopSignals := watchSignals(drain, logger)
	defer stopSignals()

	go func() { errc <- srv.Serve(ln) }()

	if aln != nil {
		acfg := adminConfig(b, srv, rt, adminWiring{owner: owner, started: start, sync: sm, queueDepth: cfg.Metrics.QueueDepth == "on", gate: gate, tls: tlsr})
		acfg.Ready = func() bool { return b.Ready() && !drain.begun() } // a draining broker takes no new clients
		acfg.Drain = func(context.Context) error {
			if _, already := drain.start(); !already {
				logger.Info("drain requested through the admin API")
			}
			return nil
		}
		leadsOver := func(ctx context.Context) bool { return b.HandLeadsOver(ctx, "this node leaves") }
		clusternode.Admin(&acfg, cn, b.HandedOver, leadsOver, func() {
			if _, already := drain.start(); !already {
				logger.Info("drain started by a cluster leave")
			}
		})
		full := gate.Wrap(admin.Handler(acfg))
		adminHandler.Store(&full)
	}
	logger.Info("serving", "listen", ln.Addr().String(), "tls", cfg.TLS.Enabled(), "admin_listen", adminAddr, "admin_tls", cfg.AdminTLS.Enabled(),
		"generation", srv.Generation(), "sync", cfg.Storage.Sync, "reconnect_grace_ms", rt.Int(runtimesettings.KeyReconnectGraceMs), "runtime_settings_version", rt.Snapshot().Version)
	if serveReadyHook != nil {
		serveReadyHook(ln.Addr().String(), adminAddr)
	}

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("signal received; draining")
	case <-drain.started:
	case runErr = <-errc:
		logger.Error("serving stopped", "err", runErr)
	}
	deadlineMs, _ := drain.start()
	if cn != nil {
		// A cluster node first hands the leads it holds over (bounded),
		// so that its exit costs no group an election; that time is not
		// taken from the drain's first phase.
		var took time.Duration
		goingAwayRedirect, took = cn.HandOverForStop(b)
		deadlineMs += took.Milliseconds()
	}
	dctx, cancel := context.WithDeadline(context.Background(), time.UnixMilli(deadlineMs))
	defer cancel()
	if err := srv.Shutdown(dctx); err != nil {
		logger.Warn("drain deadline reached with work in flight; connections closed", "err", err)
	}
	if adminSrv != nil {
		actx, acancel := context.WithTimeout(context.Background(), adminShutdownMs*time.Millisecond)
		adminSrv.Shutdown(actx)
		acancel()
	}
	if runErr != nil && !errors.Is(runErr, server.ErrServerClosed) {
		return runErr
	}
	return nil
}

// newLogger builds serve's logger: text (key=value) or json lines on w.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// exitAbandonedDrain is the exit status when a second SIGTERM/SIGINT ends a
// drain early.
const exitAbandonedDrain = 1

// serveExit ends the process on a second signal; tests replace it.
var serveExit = os.Exit

// drainer starts the planned stop once, whoever asks first: a signal, the
// end of serve's context, or the admin API.
type drainer struct {
	timeoutMs func() int64 // the runtime setting, read when the drain starts
	once      sync.Once
	started   chan struct{} // closed when the drain begins
	deadline  int64         // Unix ms; written once, inside once
}

// start begins the drain if it has not begun, and returns the deadline of its
// first phase and whether it had already begun.
func (d *drainer) start() (deadlineMs int64, already bool) {
	already = true
	d.once.Do(func() {
		already = false
		d.deadline = time.Now().Add(time.Duration(d.timeoutMs()) * time.Millisecond).UnixMilli()
		close(d.started)
	})
	return d.deadline, already
}

// begun reports whether the drain has begun.
func (d *drainer) begun() bool {
	select {
	case <-d.started:
		return true
	default:
		return false
	}
}

// watchSignals turns the first SIGTERM/SIGINT into a drain and the second into
// an exit at once. It returns a function that stops watching.
func watchSignals(d *drainer, logger *slog.Logger) (stop func()) {
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; ; {
			select {
			case sig := <-sigc:
				n++
				if n == 1 {
					d.start()
					continue
				}
				// Everything confirmed is already durable, so leaving now
				// loses nothing; the next start recovers as after a crash.
				logger.Warn("second signal during the drain: exiting now", "signal", sig.String(), "exit_status", exitAbandonedDrain)
				serveExit(exitAbandonedDrain)
			case <-quit:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigc)
		close(quit)
		<-done
	}
}

// serveRecoveringHook, when set (by tests), is called with the admin address
// once the admin listener serves and before the broker starts recovering.
var serveRecoveringHook func(adminAddr string)

// serveReadyHook, when set (by tests), is called once serve listens, with the
// client and admin addresses.
var serveReadyHook func(clientAddr, adminAddr string)

// serveAfterFunc, when set (by tests), runs the session grace timers in place
// of the process clock.
var serveAfterFunc session.AfterFunc

// heartbeat maps the setting (0 = off) onto the server's (negative = off).
func heartbeat(ms int64) int64 {
	if ms == 0 {
		return -1
	}
	return ms
}

// checkListenAuth applies the startup rule to the client listener (see
// auth.StartupCheck): an address that is not loopback-only needs users or
// auth.tokens, or auth.allow_anonymous, which is then warned about.
func checkListenAuth(cfg settings.Config, users *auth.Users, logger *slog.Logger) error {
	loopback, err := auth.LoopbackListen(cfg.Listen, nil)
	if err != nil {
		// A name that does not resolve is treated as public: the rule
		// fails closed, and the message says why.
		logger.Warn("listen address not resolved; treating it as not loopback", "listen", cfg.Listen, "err", err)
	}
	configured := users.Len() > 0 || len(cfg.Auth.Tokens) > 0
	warn, err := auth.StartupCheck("listen", cfg.Listen, loopback, configured, cfg.Auth.AllowAnonymous)
	if err != nil {
		return err
	}
	if warn {
		logger.Warn("auth.allow_anonymous is set and the client listener is not loopback-only: anyone who can reach it can publish, consume and delete queues",
			"listen", cfg.Listen)
	}
	return nil
}

// tightenDataDirListMax bounds the paths named in tightenDataDir's warning.
const tightenDataDirListMax = 10

// dataDirEntries are the entries of a data dir that versions before files
// were created private may have left readable: tightenDataDir walks these
// only, not whatever else the directory holds. What the broker creates now
// is private from the start (vfs.OS), so a new entry need not be listed.
var dataDirEntries = []string{
	"LOCK", ownerIDFile, ownerIDFile + ".tmp", nodeid.FileName, nodeid.FileName + ".tmp",
	runtimesettings.FileName, runtimesettings.FileName + ".tmp",
	"meta", "queues", sessionsDir, "wal", "cluster",
}

// tightenDataDir makes a data dir that an older version created (under a
// umask of 022: messages readable by every local user) private, as the
// broker now creates everything: directories 0700, files 0600 (the data
// dir itself and its dataDirEntries). It runs
// under the data dir's lock, before anything is read. Changing modes loses
// nothing, so it does so rather than refuse to start; the warning tells the
// operator, who may have granted a backup user access on purpose. A path
// it cannot change (owned by another user) is warned about, not fatal.
func tightenDataDir(dir string, logger *slog.Logger) {
	changed, err := vfs.MakePrivate(dir, dataDirEntries)
	if len(changed) > 0 {
		logger.Warn("data dir held files or directories that other users could read; made them private (directories 0700, files 0600)",
			"data_dir", dir, "changed", len(changed), "paths", changed[:min(len(changed), tightenDataDirListMax)])
	}
	if err != nil {
		logger.Warn("data dir: could not make every file private; other local users may read them", "data_dir", dir, "err", err)
	}
}

// loadOwnerID reads the broker's identity from the data directory, creating it on
// first start (written to a temporary file, synced, renamed, directory synced).
func loadOwnerID(dir string) (string, error) {
	path := filepath.Join(dir, ownerIDFile)
	data, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(data))
		if id == "" || len(id) > 128 {
			return "", fmt.Errorf("%s: malformed owner id", path)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var raw [12]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	id := "b-" + hex.EncodeToString(raw[:])
	// Through vfs.OS, like every file of the data dir: created 0600.
	if err := vfs.WriteFileAtomic(vfs.OS(), path, []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return id, nil
}

// adminWiring is what adminConfig needs besides the broker, the server and
// the settings store.
type adminWiring struct {
	owner      string
	started    time.Time
	sync       *syncMetrics // nil: no fsync histograms
	queueDepth bool         // metrics.queue_depth = on
	gate       *admin.Gate  // nil: no admin authentication metrics
	tls        tlsReloaders // certificate reload counters
}

// adminConfig exposes the broker, the server and their counters.
func adminConfig(b *broker.Broker, srv *server.Server, rt *runtimesettings.Store, w adminWiring) admin.Config {
	return admin.Config{
		Ready: b.Ready, Settings: rt,
		Broker: b, Server: srv, Version: serverVersion, OwnerID: w.owner, StartedAt: w.started,
		Problems: func() []string {
			var out []string
			for _, p := range b.Problems() {
				out = append(out, p.String())
			}
			return out
		},
		Metrics: metricsRegistry(b, srv, w.sync, w.queueDepth, w.gate, w.tls),
	}
}

// adminGate applies the startup rule to the admin listener (as
// checkListenAuth does to the client listener) and returns the gate its
// requests pass: a listener that is not loopback-only needs users or
// auth.tokens, or auth.allow_anonymous, which is then warned about.
// Requests without credentials are served only where auth.AnonymousAllowed
// says so, asked per request since users can be added while the broker runs.
func adminGate(cfg settings.Config, users *auth.Users, logger *slog.Logger) (*admin.Gate, error) {
	loopback, err := auth.LoopbackListen(cfg.AdminListen, nil)
	if err != nil {
		logger.Warn("admin_listen address not resolved; treating it as not loopback", "admin_listen", cfg.AdminListen, "err", err)
	}
	tokens := cfg.Auth.Tokens
	configured := func() bool { return users.Len() > 0 || len(tokens) > 0 }
	warn, err := auth.StartupCheck("admin_listen", cfg.AdminListen, loopback, configured(), cfg.Auth.AllowAnonymous)
	if err != nil {
		return nil, err
	}
	if warn {
		logger.Warn("auth.allow_anonymous is set and the admin listener is not loopback-only: anyone who can reach it can read every message, change settings and drain the broker",
			"admin_listen", cfg.AdminListen)
	}
	return &admin.Gate{
		Anonymous: func() bool { return auth.AnonymousAllowed(cfg.Auth.AllowAnonymous, loopback, configured()) },
		Loopback:  loopback,
		Users:     users,
		Tokens:    tokens,
		Logger:    logger.With("component", "admin"),
	}, nil
}
