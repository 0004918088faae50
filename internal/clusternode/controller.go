package clusternode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"time"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/controller"
	"github.com/sinewmq/sinew/internal/membership"
	"github.com/sinewmq/sinew/internal/multiraft"
	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/internal/raftnet"
	"github.com/sinewmq/sinew/internal/settings"
	"github.com/sinewmq/sinew/internal/tlsconf"
	"github.com/sinewmq/sinew/internal/vfs"
)

// RaftClusterID names the cluster in the raft transport's handshake.
const RaftClusterID = "sinew"

// reconcileEveryMs is how often the membership view is handed to the
// controller, and the peers of the view and of the committed table to the
// transport and to membership.
const reconcileEveryMs = 500

// raftTickMs is the raft host's tick: every group's raft clock.
const raftTickMs = 50

// noLeaderWarnAfterMs: a node whose controller has had no leader this long
// says why that may be.
const noLeaderWarnAfterMs = 30_000

// lateTransport lets the host and the raft transport be built in either
// order: each needs the other.
type lateTransport struct{ t *raftnet.Transport }

func (l *lateTransport) Send(to uint64, batch []multiraft.Envelope) { l.t.Send(to, batch) }

// startController starts the raft transport on cluster.peer_listen, a
// multi-raft host and this node's controller replica (log in
// <data dir>/cluster/controller). The node started without cluster.seeds
// bootstraps the controller group on its first start.
func (n *Node) startController(cfg settings.Config) error {
	rid, err := controller.RaftIDOf(n.id)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Cluster.PeerListen)
	if err != nil {
		return fmt.Errorf("cluster.peer_listen %s: %w", cfg.Cluster.PeerListen, err)
	}
	late := &lateTransport{}
	// Raft elections take 10 to 20 ticks: 0.5 to 1 s at this tick, so a
	// partition whose owner died has a new one within about a second.
	host, err := multiraft.NewHost(multiraft.Config{NodeID: rid, Transport: late, TickMs: raftTickMs})
	if err != nil {
		ln.Close()
		return fmt.Errorf("cluster: raft host: %w", err)
	}
	peerTLS, err := LoadPeerTLS(cfg, n.id)
	if err != nil {
		ln.Close()
		return err
	}
	warnSharedPeerCA(cfg, n.logger)
	tr, err := raftnet.New(raftnet.Config{ClusterID: RaftClusterID, NodeID: rid, Listener: ln, Receiver: host, Logger: n.logger, TLS: peerTLS,
		FrameBytesMax: peerFrameBytesMax})
	if err != nil {
		ln.Close()
		return fmt.Errorf("cluster: raft transport: %w", err)
	}
	late.t = tr
	n.raftID, n.peer, n.tr, n.host = rid, ln.Addr().String(), tr, host
	ctl, err := controller.Open(controller.Config{
		FS:        vfs.OS(),
		Dir:       filepath.Join(cfg.DataDir, "cluster", "controller"),
		Self:      controller.Node{RaftID: rid, ID: n.id, ClientAddr: n.client, PeerAddr: n.peer, Boot: n.boot},
		Bootstrap: len(cfg.Cluster.Seeds) == 0,
		// Every queue gets three replicas where there are three nodes.
		ReplicationFactor: controller.ReplicationFactorDefault,
		Send:              host.Sender(controller.Group),
		Logger:            n.logger,
	})
	if err != nil {
		tr.Close()
		return fmt.Errorf("cluster: %w", err)
	}
	if err := host.AddGroup(controller.Group, ctl); err != nil {
		ctl.Close()
		tr.Close()
		return fmt.Errorf("cluster: %w", err)
	}
	n.ctl = ctl
	n.logger.Info("cluster controller started", "raft_id", rid, "peer_addr", n.peer, "peer_tls", peerTLS != nil, "bootstraps_if_new", len(cfg.Cluster.Seeds) == 0)
	return nil
}

// run drives the raft host and hands the controller the membership view
// until stopController.
func (n *Node) run(ctx context.Context) {
	hostDone := make(chan struct{})
	go func() {
		defer close(hostDone)
		_ = n.host.Run(ctx)
	}()
	defer func() {
		<-hostDone
		close(n.loopDone)
	}()
	t := time.NewTicker(reconcileEveryMs * time.Millisecond)
	defer t.Stop()
	since := time.Now()
	warned := false
	for {
		n.ctl.SetFenced(n.m.Fenced() || n.stopping.Load())
		view := n.controllerView()
		n.knowTablePeers(n.ctl.Status().Table, view)
		n.ctl.SetNodeLoads(n.nodeLoads())
		n.ctl.Reconcile(view)
		if n.ctl.Status().Leader != 0 {
			since, warned = time.Now(), false
		} else if !warned && time.Since(since) > noLeaderWarnAfterMs*time.Millisecond {
			warned = true
			n.logger.Warn("cluster: the controller has had no leader for a while: is a majority of its voters up, and was one node started without cluster.seeds to bootstrap it?",
				"for_ms", time.Since(since).Milliseconds())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// controllerView is the membership view for Controller.Reconcile: this
// node and every peer alive, dead or left, with the gossip address each
// was heard at.
func (n *Node) controllerView() []controller.Member {
	view := []controller.Member{{Node: controller.Node{RaftID: n.raftID, ID: n.id, ClientAddr: n.client, PeerAddr: n.peer, GossipAddr: n.m.Addr(), Boot: n.boot}}}
	for _, p := range n.m.Members() {
		rid, err := controller.RaftIDOf(p.Name)
		if err != nil || p.MetaErr != nil || p.Meta.PeerAddr == "" || !reachablePeer(p.Addr, p.Meta.PeerAddr) {
			continue
		}
		// Quiet raft groups with a replica on a peer that died, left or
		// came back wake at the host's next tick.
		n.host.SetPeerDown(rid, p.State != membership.StateAlive)
		nd := controller.Node{RaftID: rid, ID: p.Name, ClientAddr: p.Meta.ClientAddr, PeerAddr: p.Meta.PeerAddr, GossipAddr: p.Addr, Boot: p.Meta.Boot}
		switch p.State {
		case membership.StateAlive:
			view = append(view, controller.Member{Node: nd})
		case membership.StateLeft:
			view = append(view, controller.Member{Node: nd, Gone: true})
		case membership.StateDead:
			view = append(view, controller.Member{Node: nd, Dead: true})
		}
	}
	return view
}

// knowTablePeers hands the transport every peer's raft address
// (transportPeers) and membership the gossip addresses of the committed
// table's nodes (tableGossipAddrs): a node restarted without seeds
// reaches the nodes its own table holds, through raft and through gossip,
// before any of them is back in its membership view. The view is this
// turn's controllerView.
func (n *Node) knowTablePeers(tbl *controller.Table, view []controller.Member) {
	for id, addr := range transportPeers(tbl, n.raftID, n.peer, view) {
		n.tr.AddPeer(id, addr) // a no-op when the address is the one held
	}
	n.m.SetKnownPeers(tableGossipAddrs(tbl, n.raftID, view[0].GossipAddr))
}

// transportPeers is where the raft transport reaches each other node:
// every node of the committed table that has not left, at its peer
// address, and every peer of the membership view (after this node, its
// first member), at the address gossip gives, which wins over the
// table's. A loopback address names a node on this machine, so the
// table's is taken only when this node's own peer address is loopback.
// Partitions' raft groups use the same transport.
func transportPeers(tbl *controller.Table, self uint64, selfPeer string, view []controller.Member) map[uint64]string {
	out := map[uint64]string{}
	if tbl != nil {
		for _, nd := range tbl.Nodes {
			if nd.Left || nd.RaftID == self || nd.PeerAddr == "" || !reachablePeer(selfPeer, nd.PeerAddr) {
				continue
			}
			out[nd.RaftID] = nd.PeerAddr
		}
	}
	for _, m := range view {
		if m.RaftID != self && m.PeerAddr != "" {
			out[m.RaftID] = m.PeerAddr
		}
	}
	return out
}

// tableGossipAddrs is the gossip address of every node of the committed
// table that has not left, other than this node (self, at selfGossip),
// sorted. A loopback address is taken only when this node's is loopback.
func tableGossipAddrs(tbl *controller.Table, self uint64, selfGossip string) []string {
	if tbl == nil {
		return nil
	}
	var out []string
	for _, nd := range tbl.Nodes {
		if nd.Left || nd.RaftID == self || nd.GossipAddr == "" || nd.GossipAddr == selfGossip || !reachablePeer(selfGossip, nd.GossipAddr) {
			continue
		}
		out = append(out, nd.GossipAddr)
	}
	slices.Sort(out)
	return out
}

// stopController stops the host loop, the controller and the transport.
func (n *Node) stopController() {
	if n.stop != nil {
		n.stop()
		<-n.loopDone
	}
	if n.ctl != nil {
		if err := n.ctl.Close(); err != nil {
			n.logger.Warn("cluster: close controller", "err", err)
		}
	}
	if n.tr != nil {
		n.tr.Close()
	}
}

// controllerView is the admin API's view of the controller replica.
func (n *Node) controllerAdminView() *admin.ControllerView {
	st := n.ctl.Status()
	names := map[uint64]string{}
	v := &admin.ControllerView{Term: st.Term, Applied: st.Applied, Error: st.Err, Voters: []string{}, Learners: []string{}, Nodes: []admin.ControllerNodeView{}}
	for _, nd := range st.Table.Nodes {
		names[nd.RaftID] = nd.ID
		v.Nodes = append(v.Nodes, admin.ControllerNodeView{ID: nd.ID, RaftID: nd.RaftID, ClientAddr: nd.ClientAddr, PeerAddr: nd.PeerAddr, Left: nd.Left})
	}
	name := func(id uint64) string {
		if s, ok := names[id]; ok {
			return s
		}
		return fmt.Sprintf("raft:%d", id)
	}
	if st.Leader != 0 {
		v.Leader = name(st.Leader)
	}
	for _, id := range slices.Sorted(slices.Values(st.Voters)) {
		v.Voters = append(v.Voters, name(id))
	}
	for _, id := range slices.Sorted(slices.Values(st.Learners)) {
		v.Learners = append(v.Learners, name(id))
	}
	return v
}

// reachablePeer reports whether a peer's raft address can be reached from
// here: a loopback peer address names the peer's own machine, which is
// this one only when its gossip address is loopback too.
func reachablePeer(gossipAddr, peerAddr string) bool {
	return !isLoopbackAddr(peerAddr) || isLoopbackAddr(gossipAddr)
}

func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// peerTLSFileBytesMax bounds each peer TLS file read.
const peerTLSFileBytesMax = 1 << 20

// LoadPeerTLS reads cluster.peer_tls_* (nil when unset: plain TCP, which
// the settings allow on loopback only). The certificate must name this
// node (nodeID) as tlsconf.PeerURI does: every peer would refuse it
// otherwise, and the cause is plainest here.
func LoadPeerTLS(cfg settings.Config, nodeID string) (*raftnet.PeerTLS, error) {
	c := cfg.Cluster
	if c.PeerTLSCertFile == "" {
		return nil, nil
	}
	read := func(key, path string) ([]byte, error) {
		b, err := vfs.ReadFileMax(vfs.OS(), path, peerTLSFileBytesMax)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		return b, nil
	}
	certPEM, err := read("cluster.peer_tls_cert_file", c.PeerTLSCertFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := read("cluster.peer_tls_key_file", c.PeerTLSKeyFile)
	if err != nil {
		return nil, err
	}
	// A private key others may read lets them pose as this node.
	if err := vfs.CheckPrivate(vfs.OS(), c.PeerTLSKeyFile); err != nil {
		return nil, fmt.Errorf("cluster.peer_tls_key_file %s: %w", c.PeerTLSKeyFile, err)
	}
	caPEM, err := read("cluster.peer_tls_ca_file", c.PeerTLSCAFile)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("cluster.peer_tls_cert_file %s with cluster.peer_tls_key_file %s: %w", c.PeerTLSCertFile, c.PeerTLSKeyFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("cluster.peer_tls_ca_file %s: no PEM certificate in it", c.PeerTLSCAFile)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("cluster.peer_tls_cert_file %s: %w", c.PeerTLSCertFile, err)
		}
	}
	named, err := tlsconf.PeerNodeID(cert.Leaf, RaftClusterID)
	if err == nil && named != nodeID {
		err = fmt.Errorf("it names node %s", named)
	}
	if err != nil {
		return nil, fmt.Errorf("cluster.peer_tls_cert_file %s is not this node's peer certificate: %w; this node (data directory %s) is %s, so its certificate needs the URI SAN %s (sinew cert generate --peer-data-dirs %s makes one; docs/cluster.md, \"Peer TLS\")",
			c.PeerTLSCertFile, err, cfg.DataDir, nodeID, tlsconf.PeerURI(RaftClusterID, nodeID), cfg.DataDir)
	}
	return &raftnet.PeerTLS{Certificate: cert, CAs: pool, RaftID: controller.RaftIDOf}, nil
}

// warnSharedPeerCA warns when a CA of cluster.peer_tls_ca_file is also one
// of the client CAs (tls.client_ca_file, admin_tls.client_ca_file): every
// client certificate it issues then chains to the peers' CA, and only the
// node name in a peer certificate keeps a client from the peer port. A CA
// of their own for the peers keeps the two apart. Files that cannot be
// read are left to the code that loads them.
func warnSharedPeerCA(cfg settings.Config, logger *slog.Logger) {
	if cfg.Cluster.PeerTLSCAFile == "" {
		return
	}
	peer := caCerts(cfg.Cluster.PeerTLSCAFile)
	for _, cl := range []struct{ key, path string }{
		{"tls.client_ca_file", cfg.TLS.ClientCAFile}, {"admin_tls.client_ca_file", cfg.AdminTLS.ClientCAFile},
	} {
		if cl.path == "" {
			continue
		}
		for _, c := range caCerts(cl.path) {
			if slices.ContainsFunc(peer, c.Equal) {
				logger.Warn("cluster: the peer CA is also a client CA: every client certificate it issues chains to the peers' CA, and only the node name in a peer certificate keeps clients off the peer port; give the peers a CA of their own (sinew cert generate writes peer-ca.pem)",
					"cluster.peer_tls_ca_file", cfg.Cluster.PeerTLSCAFile, cl.key, cl.path, "ca_subject", c.Subject.String())
				break
			}
		}
	}
}

// caCerts returns the certificates of a PEM file (none when it cannot be
// read).
func caCerts(path string) []*x509.Certificate {
	b, err := vfs.ReadFileMax(vfs.OS(), path, peerTLSFileBytesMax)
	if err != nil {
		return nil
	}
	var out []*x509.Certificate
	for len(b) > 0 {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(blk.Bytes); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// peerFrameBytesMax bounds one frame of the raft transport: room for the
// largest snapshot a partition sends a replica that fell too far behind
// (with the default 4 MiB frame a larger one was dropped, and the replica
// never caught up), plus the batch's framing.
const peerFrameBytesMax = partition.RaftSnapshotBytesMax + 1<<20
