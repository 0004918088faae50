package clusternode

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/controller"
	"github.com/sinewmq/sinew/internal/membership"
	"github.com/sinewmq/sinew/internal/multiraft"
	"github.com/sinewmq/sinew/internal/nodeid"
	"github.com/sinewmq/sinew/internal/raftnet"
	"github.com/sinewmq/sinew/internal/settings"
	"github.com/sinewmq/sinew/internal/vfs"
)

// idConflictLogEveryMs spaces the id-conflict error lines; the conflicts
// in between are counted in the next one.
const idConflictLogEveryMs = 60_000

// clusterLeaveTimeoutMs bounds how long a leave waits for the news to
// spread before the node goes on to drain.
const clusterLeaveTimeoutMs = 5_000

// gossipKeyBytesMax bounds the key file read (a base64 key of 32 bytes is
// 44 characters).
const gossipKeyBytesMax = 4 << 10

// Node is a node's membership in its cluster (cluster.enabled) and
// its replica of the controller group, which holds the committed node
// table, the queue catalogue and the runtime settings.
type Node struct {
	cfg    settings.Config // the settings it started with
	id     string
	raftID uint64
	client string // this node's client address
	peer   string // this node's raft transport address
	boot   uint64 // this run of the process (membership.Meta.Boot)
	m      *membership.Membership
	// down holds the raft ids of the peers membership sees dead or gone
	// (PeerAlive); replaced whole by watch after each event.
	down   atomic.Pointer[map[uint64]struct{}]
	logger *slog.Logger
	done   chan struct{}

	tr       *raftnet.Transport
	host     *multiraft.Host
	ctl      *controller.Controller
	stop     context.CancelFunc
	loopDone chan struct{} // the host loop and the reconcile loop

	leaveOnce sync.Once
	leaveErr  error
	// stopping is set once the node's planned stop began
	// (HandOverForStop): its controller replica stays fenced.
	stopping atomic.Bool
}

// newBoot draws a run's boot value: random, never zero (zero is "none
// sent", from a peer of gossip metadata version 1).
func newBoot() (uint64, error) {
	var b [8]byte
	for {
		if _, err := io.ReadFull(rand.Reader, b[:]); err != nil {
			return 0, fmt.Errorf("cluster: boot id: %w", err)
		}
		if v := binary.BigEndian.Uint64(b[:]); v != 0 {
			return v, nil
		}
	}
}

// Start gives the node its stable id (file node_id in the data
// directory), starts gossip on cluster.gossip_listen and joins
// cluster.seeds. A seed that cannot be reached is not an error: it is
// logged, and the node keeps trying (see membership.Config.Seeds).
func Start(cfg settings.Config, clientAddr string, logger *slog.Logger) (*Node, error) {
	c := cfg.Cluster
	id, err := nodeid.Load(vfs.OS(), cfg.DataDir, rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("cluster: node id: %w", err)
	}
	host, port, err := net.SplitHostPort(c.GossipListen)
	if err != nil {
		return nil, fmt.Errorf("cluster.gossip_listen: %w", err)
	}
	pn, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("cluster.gossip_listen: port %q: %w", port, err)
	}
	var key []byte
	if c.GossipKeyFile != "" {
		if key, err = readGossipKey(c.GossipKeyFile); err != nil {
			return nil, err
		}
	}
	profile := membership.SeedProfile()
	if c.Profile == "lan" {
		profile = membership.LANProfile()
	}
	boot, err := newBoot()
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, id: id, client: clientAddr, boot: boot, logger: logger, done: make(chan struct{}), loopDone: make(chan struct{})}
	if err := n.startController(cfg); err != nil {
		return nil, err
	}
	m, err := membership.New(membership.Config{
		Meta:      membership.Meta{NodeID: id, ClientAddr: clientAddr, PeerAddr: n.peer, Boot: boot},
		BindAddr:  host,
		BindPort:  int(pn),
		Profile:   profile,
		Seeds:     c.Seeds,
		SecretKey: key,
		Logger:    log.New(&memberlistLog{logger: logger, now: time.Now}, "", 0),
	})
	if err != nil {
		n.stopController()
		return nil, fmt.Errorf("cluster.gossip_listen %s: %w", c.GossipListen, err)
	}
	n.m = m
	go n.watch()
	ctx, cancel := context.WithCancel(context.Background())
	n.stop = cancel
	go n.run(ctx)
	logger.Info("cluster membership started", "node_id", id, "gossip_addr", m.Addr(), "seeds", strings.Join(c.Seeds, ","),
		"profile", c.Profile, "encrypted", key != nil)
	if err := m.JoinErr(); err != nil {
		logger.Warn("cluster: no seed could be joined yet; retrying in the background (not started yet, unreachable, or another gossip key)",
			"seeds", strings.Join(c.Seeds, ","), "err", err)
	}
	return n, nil
}

// CheckAuth applies the cluster's startup rule: a clustered node
// with users (hasUsers) or auth.tokens needs cluster.gossip_key_file and
// the cluster.peer_tls_* files, on loopback too. Without them any process
// that reaches the gossip or peer port (on loopback: any local process,
// whoever runs it) can join the cluster, be placed among a queue's
// replicas and read its messages, or send raft messages as a node, which
// would make the users' permissions moot. Without users or tokens (the
// anonymous quick start) the settings' off-loopback rules alone apply.
func CheckAuth(cfg settings.Config, hasUsers bool) error {
	c := cfg.Cluster
	if !c.Enabled || (!hasUsers && len(cfg.Auth.Tokens) == 0) {
		return nil
	}
	missing, how := clusterAuthMissing(c)
	if len(missing) == 0 {
		return nil
	}
	what := "users"
	if !hasUsers {
		what = "auth.tokens"
	}
	return fmt.Errorf("cluster: %s are configured, so a cluster node needs %s, on loopback too: without them any process that reaches the gossip or peer port can join the cluster and read the messages it replicates (docs/security.md, \"The cluster's ports\"); make %s",
		what, strings.Join(missing, " and "), strings.Join(how, "; and "))
}

// clusterAuthMissing names the settings of c that a cluster with users or
// tokens needs and c lacks, and how to make each.
func clusterAuthMissing(c settings.Cluster) (missing, how []string) {
	if c.GossipKeyFile == "" {
		missing = append(missing, "cluster.gossip_key_file (--cluster-gossip-key-file)")
		how = append(how, "a gossip key, the same file on every node: (umask 077; head -c 32 /dev/urandom | base64 > gossip.key)")
	}
	if c.PeerTLSCertFile == "" {
		missing = append(missing, "cluster.peer_tls_cert_file, cluster.peer_tls_key_file and cluster.peer_tls_ca_file (--cluster-peer-tls-*)")
		how = append(how, "peer certificates, one per node naming its node id: sinew cert generate --peer-data-dirs <each node's data directory>, or your own CA (docs/cluster.md, \"Peer TLS\")")
	}
	return missing, how
}

// memberlistWarnsMax WARN lines from memberlist are logged per
// memberlistWarnWindowMs; the rest of the window's go to DEBUG and are
// counted in one WARN line when the next window opens. Anyone who can
// reach the gossip port can make memberlist complain once per packet.
const (
	memberlistWarnsMax     = 10
	memberlistWarnWindowMs = 10_000
)

// memberlistLog turns memberlist's log lines into records of the broker
// log: its errors and warnings (a message no key could decrypt, a
// conflicting address) at WARN, bounded per window, the rest at DEBUG.
type memberlistLog struct {
	logger *slog.Logger
	now    func() time.Time

	mu         sync.Mutex
	windowEnd  time.Time
	warns      int
	suppressed int
}

func (w *memberlistLog) Write(b []byte) (int, error) {
	line := strings.TrimSpace(string(b))
	level := slog.LevelDebug
	if tag, rest, ok := strings.Cut(line, "] "); ok && strings.HasPrefix(tag, "[") {
		if tag == "[ERR" || tag == "[WARN" {
			level = slog.LevelWarn
		}
		line = rest
	}
	if !strings.HasPrefix(line, "memberlist: ") {
		line = "memberlist: " + line
	}
	if level == slog.LevelWarn && !w.admitWarn() {
		level = slog.LevelDebug
	}
	w.logger.Log(context.Background(), level, line)
	return len(b), nil
}

// admitWarn reports whether one more WARN fits this window, and reports
// what the last window suppressed when a new one opens.
func (w *memberlistLog) admitWarn() bool {
	w.mu.Lock()
	now := w.now()
	var suppressed int
	if !now.Before(w.windowEnd) {
		suppressed, w.suppressed, w.warns = w.suppressed, 0, 0
		w.windowEnd = now.Add(memberlistWarnWindowMs * time.Millisecond)
	}
	ok := w.warns < memberlistWarnsMax
	if ok {
		w.warns++
	} else {
		w.suppressed++
	}
	w.mu.Unlock()
	if suppressed > 0 {
		w.logger.Warn("memberlist: more warnings were logged at DEBUG only", "suppressed", suppressed, "window_ms", memberlistWarnWindowMs)
	}
	return ok
}

// readGossipKey reads a base64 key of 16, 24 or 32 bytes, from a file no
// one but its owner may read: whoever reads the key can join the cluster's
// gossip and feed it forged membership.
func readGossipKey(path string) ([]byte, error) {
	raw, err := vfs.ReadFileMax(vfs.OS(), path, gossipKeyBytesMax)
	if err != nil {
		return nil, fmt.Errorf("cluster.gossip_key_file: %w", err)
	}
	if err := vfs.CheckPrivate(vfs.OS(), path); err != nil {
		return nil, fmt.Errorf("cluster.gossip_key_file %s: %w", path, err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("cluster.gossip_key_file %s: not base64: %w", path, err)
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("cluster.gossip_key_file %s: a key of %d bytes, not 16, 24 or 32", path, n)
	}
	return key, nil
}

// watch logs every membership event until the membership closes.
func (n *Node) watch() {
	defer close(n.done)
	var lastConflict time.Time
	conflicts := 0
	for ev := range n.m.Events() {
		n.noteDown()
		attrs := []any{"node_id", ev.Node, "client_addr", ev.Meta.ClientAddr, "coalesced", ev.Coalesced}
		if ev.MetaErr != nil {
			attrs = append(attrs, "meta_err", ev.MetaErr)
		}
		switch ev.Kind {
		case membership.EventDead:
			n.logger.Warn("cluster node dead", attrs...)
		case membership.EventFenced:
			n.logger.Warn("cluster: this node sees a majority of its peers dead (fenced)", "node_id", n.id)
		case membership.EventUnfenced:
			n.logger.Info("cluster: this node sees a majority again (unfenced)", "node_id", n.id)
		case membership.EventIDConflict:
			// At most one line per idConflictLogEveryMs: without a gossip
			// key, anyone who reaches the port can announce this id.
			conflicts += 1 + ev.Coalesced
			if now := time.Now(); now.Sub(lastConflict) >= idConflictLogEveryMs*time.Millisecond {
				n.logger.Error("cluster: another process announces this node's id from another address; each node needs its own data directory (was one copied?)",
					"node_id", n.id, "other_gossip_addr", ev.Addr, "other_client_addr", ev.Meta.ClientAddr, "conflicts", conflicts)
				lastConflict, conflicts = now, 0
			}
		default:
			n.logger.Info("cluster node "+ev.Kind.String(), attrs...)
		}
	}
}

// view is GET /api/v1/nodes.
func (n *Node) view() admin.NodesView {
	v := admin.NodesView{Cluster: true, Fenced: n.m.Fenced(),
		Self: admin.NodeView{ID: n.id, State: "self", GossipAddr: n.m.Addr(), ClientAddr: n.client}}
	loads := n.peerLoadViews()
	for _, p := range n.m.Members() {
		v.Nodes = append(v.Nodes, admin.NodeView{ID: p.Name, State: p.State.String(), GossipAddr: p.Addr, ClientAddr: p.Meta.ClientAddr, Load: loads[p.Name]})
	}
	slices.SortFunc(v.Nodes, func(a, b admin.NodeView) int { return strings.Compare(a.ID, b.ID) })
	v.Controller = n.controllerAdminView()
	return v
}

// leave tells the other nodes this one is leaving (they see it left, not
// dead), and in the background waits until its replicas are handed over
// (handedOver: the recovery plan moved them and the new replicas vote,
// bounded by clusterHandoverTimeoutMs) before it starts the drain, after
// which serve exits: so a leave costs no partition its quorum, even when
// another node leaves right after this one has gone. Asking again
// returns the first answer.
func (n *Node) leave(handedOver func() (bool, string), leadsOver func(context.Context) bool, drain func()) error {
	n.leaveOnce.Do(func() {
		n.logger.Info("cluster: leaving; the replicas here are handed over, then the node drains", "node_id", n.id)
		if err := n.m.Leave(clusterLeaveTimeoutMs * time.Millisecond); err != nil {
			n.leaveErr = fmt.Errorf("cluster: leave: %w", err)
			n.logger.Warn("cluster: the leave did not reach every node; they will see this node dead", "err", err)
		}
		alive := 0
		for _, p := range n.m.Members() {
			if p.State == membership.StateAlive {
				alive++
			}
		}
		if alive < n.ctl.ReplicationFactor() {
			// Every other node holds a replica already: there is no one
			// to hand them to, and the partitions run on the others (one
			// replica fewer) until a node joins, which the plan then uses.
			// Their leads go to the others first, so that this node's
			// exit costs no partition an election.
			n.logger.Info("cluster: no spare node to hand the replicas to; handing their leads over, then draining", "node_id", n.id, "alive_peers", alive)
			go func() {
				n.awaitHandover("partition leads", clusterLeadsOverTimeoutMs, time.Now().Add(clusterLeadsOverTimeoutMs*time.Millisecond),
					func(ctx context.Context) (bool, string) { return leadsOver(ctx), "" })
				drain()
			}()
			return
		}
		go func() {
			deadline := time.Now().Add(clusterHandoverTimeoutMs * time.Millisecond)
			// Recorded through the controller at once (this node may lead
			// it, and would not report its own leave), so the recovery
			// plan starts moving the replicas.
			lctx, cancel := context.WithDeadline(context.Background(), deadline)
			if err := n.ctl.Leave(lctx); err != nil {
				n.logger.Warn("cluster: the controller did not record the leave", "err", err)
			}
			cancel()
			n.awaitHandover("replicas", clusterHandoverTimeoutMs, deadline,
				func(context.Context) (bool, string) { return handedOver() })
			drain()
		}()
	})
	return n.leaveErr
}

// awaitHandover polls check until it reports done or deadline passes, and
// logs which: "cluster: <what> handed over; draining", or, at WARN, that
// they were not (with what check last named as still waiting).
func (n *Node) awaitHandover(what string, timeoutMs int, deadline time.Time, check func(context.Context) (bool, string)) {
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		done, waiting := check(ctx)
		cancel()
		if done {
			n.logger.Info("cluster: "+what+" handed over; draining", "node_id", n.id)
			return
		}
		if time.Now().After(deadline) {
			n.logger.Warn("cluster: "+what+" not handed over in time; draining anyway", "waiting_for", waiting, "timeout_ms", timeoutMs)
			return
		}
		time.Sleep(clusterHandoverPollMs * time.Millisecond) // polls the broker's view; bounded by the deadline
	}
}

// A leaving node waits at most clusterHandoverTimeoutMs for its replicas
// to be handed over, looking every clusterHandoverPollMs.
const (
	clusterHandoverTimeoutMs = 60_000
	clusterHandoverPollMs    = 100
)

// A leaving node with no spare waits at most clusterLeadsOverTimeoutMs
// for its partitions' leads to move to the other replicas (a transfer
// takes a round trip; one a replica cannot take is abandoned by raft
// after an election timeout, and tried again).
const clusterLeadsOverTimeoutMs = 10_000

// close stops gossip (without a leave, the others see a crash unless
// leave came first), waits for the event logger, and stops the controller
// replica and its transport.
func (n *Node) Close() {
	if err := n.m.Close(); err != nil {
		n.logger.Warn("cluster: stop gossip", "err", err)
	}
	<-n.done
	n.stopController()
}

// Admin wires n into the admin API (nil n: a node that runs alone).
func Admin(acfg *admin.Config, n *Node, handedOver func() (bool, string), leadsOver func(context.Context) bool, drain func()) {
	if n == nil {
		return
	}
	acfg.Nodes = n.view
	acfg.UserAddCheck = func() error {
		missing, how := clusterAuthMissing(n.cfg.Cluster)
		if len(missing) == 0 {
			return nil
		}
		return fmt.Errorf("no user is added: this node runs in a cluster without %s, and a cluster node with users needs them, on loopback too (docs/security.md, \"The cluster's ports\"); make %s, restart every node with them, then add users",
			strings.Join(missing, " and "), strings.Join(how, "; and "))
	}
	acfg.LeaveCluster = func(context.Context) error { return n.leave(handedOver, leadsOver, drain) }
	acfg.ForgetNode = func(id string) error {
		if err := n.m.Forget(id); err != nil {
			return err
		}
		n.logger.Info("cluster: node forgotten: it counts as left", "node_id", id)
		return nil
	}
	n.adminMoves(acfg)
	if reg, ok := acfg.Metrics.(*prometheus.Registry); ok {
		reg.MustRegister(clusterCollector{n})
	}
}

// MetricDoc names a metric family a cluster node serves, with its help.
type MetricDoc struct{ Name, Help string }

// Metrics lists the metric families a cluster node serves (on /metrics,
// when cluster.enabled), for the operator docs' table.
func Metrics() []MetricDoc {
	return []MetricDoc{
		{clusterNodesName, clusterNodesHelp},
		{clusterFencedName, clusterFencedHelp},
		{ctlLeaderName, ctlLeaderHelp},
		{ctlHasLeaderName, ctlHasLeaderHelp},
		{ctlTermName, ctlTermHelp},
		{ctlMembersName, ctlMembersHelp},
		{raftDroppedName, raftDroppedHelp},
		{raftTicksName, raftTicksHelp},
		{underReplName, underReplHelp},
	}
}

// The cluster metrics, served when cluster.enabled.
const (
	clusterNodesName  = "sinew_cluster_nodes"
	clusterNodesHelp  = "Other cluster nodes in this node's membership view, by state: alive, dead (stopped answering probes past the suspicion timeout), left (left with a leave). Served only with cluster.enabled."
	clusterFencedName = "sinew_cluster_fenced"
	clusterFencedHelp = "1 while this node sees a majority of its peers dead, else 0. Served only with cluster.enabled."
	ctlLeaderName     = "sinew_controller_leader"
	ctlLeaderHelp     = "1 while this node leads the controller group, else 0. Served only with cluster.enabled."
	ctlTermName       = "sinew_controller_term"
	ctlTermHelp       = "The controller group's raft term as this node knows it. Served only with cluster.enabled."
	ctlMembersName    = "sinew_controller_members"
	ctlMembersHelp    = "Nodes in the controller group's configuration, by role: voter, learner. Served only with cluster.enabled."
	raftDroppedName   = "sinew_raft_messages_dropped_total"
	raftDroppedHelp   = "Raft messages this node dropped, by where: inbox (a group's inbound queue full), outbox (a peer's outbound queue full), send_queue (batches the transport's queue to a peer had no room for), write (batches lost with a failed write). Raft resends what is lost, at the cost of a tick or more. Served only with cluster.enabled."
	raftTicksName     = "sinew_raft_group_ticks_total"
	raftTicksHelp     = "Raft group ticks on this node, by kind: ticked (a group's raft clock advanced), quiet (a replicated group skipped because it is idle, or a group of one, which never needs one). An idle cluster's ticked rate falls to that of its controller group. Served only with cluster.enabled."
	underReplName     = "sinew_queues_under_replicated"
	underReplHelp     = "Queues with fewer replicas than the replication factor (3, capped by the cluster's nodes), or with a replica move under way, in the catalogue as this node applied it. The controller adds and moves replicas until it is 0. Served only with cluster.enabled."
	ctlHasLeaderName  = "sinew_controller_has_leader"
	ctlHasLeaderHelp  = "1 while this node knows a leader of the controller group, else 0 (no quorum, or not added yet). Served only with cluster.enabled."
)

var (
	clusterNodesDesc  = prometheus.NewDesc(clusterNodesName, clusterNodesHelp, []string{"state"}, nil)
	clusterFencedDesc = prometheus.NewDesc(clusterFencedName, clusterFencedHelp, nil, nil)
	ctlLeaderDesc     = prometheus.NewDesc(ctlLeaderName, ctlLeaderHelp, nil, nil)
	ctlTermDesc       = prometheus.NewDesc(ctlTermName, ctlTermHelp, nil, nil)
	ctlMembersDesc    = prometheus.NewDesc(ctlMembersName, ctlMembersHelp, []string{"role"}, nil)
	ctlHasLeaderDesc  = prometheus.NewDesc(ctlHasLeaderName, ctlHasLeaderHelp, nil, nil)
	raftDroppedDesc   = prometheus.NewDesc(raftDroppedName, raftDroppedHelp, []string{"where"}, nil)
	raftTicksDesc     = prometheus.NewDesc(raftTicksName, raftTicksHelp, []string{"kind"}, nil)
	underReplDesc     = prometheus.NewDesc(underReplName, underReplHelp, nil, nil)
)

// clusterCollector exports the membership view at scrape time.
type clusterCollector struct{ n *Node }

// Describe implements prometheus.Collector.
func (c clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- clusterNodesDesc
	ch <- clusterFencedDesc
	ch <- ctlLeaderDesc
	ch <- ctlTermDesc
	ch <- ctlMembersDesc
	ch <- ctlHasLeaderDesc
	ch <- raftDroppedDesc
	ch <- raftTicksDesc
	ch <- underReplDesc
}

// Collect implements prometheus.Collector.
func (c clusterCollector) Collect(ch chan<- prometheus.Metric) {
	count := map[membership.State]int{}
	for _, p := range c.n.m.Members() {
		count[p.State]++
	}
	for _, s := range []membership.State{membership.StateAlive, membership.StateDead, membership.StateLeft} {
		ch <- prometheus.MustNewConstMetric(clusterNodesDesc, prometheus.GaugeValue, float64(count[s]), s.String())
	}
	fenced := 0.0
	if c.n.m.Fenced() {
		fenced = 1
	}
	ch <- prometheus.MustNewConstMetric(clusterFencedDesc, prometheus.GaugeValue, fenced)
	st := c.n.ctl.Status()
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	ch <- prometheus.MustNewConstMetric(ctlLeaderDesc, prometheus.GaugeValue, b(st.Leader != 0 && st.Leader == c.n.raftID))
	ch <- prometheus.MustNewConstMetric(ctlHasLeaderDesc, prometheus.GaugeValue, b(st.Leader != 0))
	ch <- prometheus.MustNewConstMetric(ctlTermDesc, prometheus.GaugeValue, float64(st.Term))
	ch <- prometheus.MustNewConstMetric(underReplDesc, prometheus.GaugeValue, float64(st.Table.UnderReplicatedQueues(c.n.ctl.ReplicationFactor())))
	ch <- prometheus.MustNewConstMetric(ctlMembersDesc, prometheus.GaugeValue, float64(len(st.Voters)), "voter")
	ch <- prometheus.MustNewConstMetric(ctlMembersDesc, prometheus.GaugeValue, float64(len(st.Learners)), "learner")
	hs, ts := c.n.host.Stats(), c.n.tr.Stats()
	ch <- prometheus.MustNewConstMetric(raftDroppedDesc, prometheus.CounterValue, float64(hs.InboxDropped), "inbox")
	ch <- prometheus.MustNewConstMetric(raftDroppedDesc, prometheus.CounterValue, float64(hs.OutboxDropped), "outbox")
	ch <- prometheus.MustNewConstMetric(raftDroppedDesc, prometheus.CounterValue, float64(ts.QueueDropped), "send_queue")
	ch <- prometheus.MustNewConstMetric(raftDroppedDesc, prometheus.CounterValue, float64(ts.WriteLost), "write")
	ch <- prometheus.MustNewConstMetric(raftTicksDesc, prometheus.CounterValue, float64(hs.GroupTicks), "ticked")
	ch <- prometheus.MustNewConstMetric(raftTicksDesc, prometheus.CounterValue, float64(hs.QuietSkips), "quiet")
}
