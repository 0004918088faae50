package raftnet

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/multiraft"
	"github.com/sinewmq/sinew/internal/tlsconf"
)

// Errors a connection ends with.
var (
	// ErrFrame reports a frame that is too large, truncated or fails its
	// checksum, or a batch that does not decode.
	ErrFrame = errors.New("raftnet: bad frame")
	// ErrHandshake reports a first frame that is not a valid hello.
	ErrHandshake = errors.New("raftnet: bad handshake")
	// ErrOtherCluster reports a peer of another cluster.
	ErrOtherCluster = errors.New("raftnet: peer belongs to another cluster")
	// ErrPeerIdentity reports, under TLS, a peer certificate that names no
	// node of the cluster (a client certificate, say), or a node other
	// than the one the hello claims or the dialler wanted.
	ErrPeerIdentity = errors.New("raftnet: peer certificate does not name the node")
)

const (
	helloMagic   = "SNRN"
	helloVersion = 1
	clusterIDMax = 128
	headerBytes  = 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Config configures a Transport.
type Config struct {
	// ClusterID names the cluster; a peer with another is refused.
	ClusterID string
	// NodeID is this node's id, as raft's replica ids name it.
	NodeID uint64
	// Listener accepts peer connections (the caller binds it).
	Listener net.Listener
	// Receiver gets every batch read from a peer.
	Receiver multiraft.Receiver
	// FrameBytesMax bounds one frame; a larger outgoing batch is split, a
	// larger incoming frame closes the connection. Default 4 MiB.
	FrameBytesMax int
	// SendQueueMax bounds the batches waiting per peer. Default 256.
	SendQueueMax int
	// InboundConnsMax bounds the accepted connections open at once; one
	// more is closed at once and counted as refused. Default 128: a peer
	// opens two (its messages and its snapshot lane), so 64 peers.
	InboundConnsMax int
	// DialTimeoutMs bounds a dial and its handshake. Default 2000.
	DialTimeoutMs int
	// WriteTimeoutMs bounds one frame's write. Default 2000.
	WriteTimeoutMs int
	// BackoffMinMs and BackoffMaxMs bound the wait between failed dials.
	// Defaults 50 and 2000.
	BackoffMinMs, BackoffMaxMs int
	// Logger receives refused peers and lost connections; nil discards.
	Logger *slog.Logger
	// TLS, when set, runs every connection over mutual TLS; see PeerTLS.
	// nil: plain TCP, for loopback only.
	TLS *PeerTLS
}

// PeerTLS is the mutual TLS of a Transport (Config.TLS). Each side
// presents Certificate and accepts only a peer whose certificate chains to
// CAs with the usage of the peer's side (client auth for a dialler's
// certificate, server auth for an acceptor's) and names one node of the
// cluster in a URI SAN
// sinew-node://<Config.ClusterID>/<node id> (tlsconf.PeerURI). That node
// is the peer's identity: an acceptor refuses a hello that claims another
// node, a dialler a peer that is not the node it dialled. Host names are
// not checked (nodes are known by id, and may move). So a certificate of
// the same CA made for a client, or for another node, cannot send raft
// messages as a node.
type PeerTLS struct {
	Certificate tls.Certificate
	CAs         *x509.CertPool
	// RaftID maps the node id a certificate names to its raft id (the id
	// hellos carry). Required.
	RaftID func(nodeID string) (uint64, error)
}

// config returns the tls.Config of one side: both present the node's
// certificate and verify the other's chain against the cluster CA and its
// node name (peerIdentity), with no host name check.
func (p *PeerTLS) config(server bool, cluster string) *tls.Config {
	usage := x509.ExtKeyUsageServerAuth
	if server {
		usage = x509.ExtKeyUsageClientAuth
	}
	verify := func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("raftnet: peer presented no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: p.CAs, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			return err
		}
		_, _, err := p.identity(cs.PeerCertificates[0], cluster)
		return err
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{p.Certificate},
		// Chains and node names are checked by VerifyConnection, without
		// a host name.
		InsecureSkipVerify: true,
		VerifyConnection:   verify,
	}
	if server {
		cfg.ClientAuth = tls.RequireAnyClientCert
	}
	return cfg
}

// identity returns the node id and raft id cert names in cluster.
func (p *PeerTLS) identity(cert *x509.Certificate, cluster string) (string, uint64, error) {
	id, err := tlsconf.PeerNodeID(cert, cluster)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %w", ErrPeerIdentity, err)
	}
	rid, err := p.RaftID(id)
	if err != nil {
		return "", 0, fmt.Errorf("%w: node id %q: %w", ErrPeerIdentity, id, err)
	}
	return id, rid, nil
}

// peerIdentity returns the node id and raft id of a TLS connection's
// verified peer certificate.
func (t *Transport) peerIdentity(tc *tls.Conn) (string, uint64, error) {
	cs := tc.ConnectionState()
	if len(cs.PeerCertificates) == 0 {
		return "", 0, fmt.Errorf("%w: no certificate", ErrPeerIdentity)
	}
	return t.cfg.TLS.identity(cs.PeerCertificates[0], t.cfg.ClusterID)
}

// check refuses a PeerTLS whose own certificate does not name this node:
// every peer would refuse it, and the cause is clearest here.
func (p *PeerTLS) check(cluster string, self uint64) error {
	if p.RaftID == nil || p.CAs == nil || len(p.Certificate.Certificate) == 0 {
		return errors.New("raftnet: TLS needs a certificate, a CA pool and RaftID")
	}
	leaf := p.Certificate.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(p.Certificate.Certificate[0]); err != nil {
			return fmt.Errorf("raftnet: this node's certificate: %w", err)
		}
	}
	id, rid, err := p.identity(leaf, cluster)
	if err != nil {
		return fmt.Errorf("raftnet: this node's certificate: %w", err)
	}
	if rid != self {
		return fmt.Errorf("%w: this node's certificate names node %s (raft id %d), this node's raft id is %d", ErrPeerIdentity, id, rid, self)
	}
	return nil
}

// Stats counts what a Transport did.
type Stats struct {
	QueueDropped uint64 // batches dropped on a full send queue or unknown peer
	WriteLost    uint64 // batches lost with a failed write
	Dials        uint64 // dial attempts
	Refused      uint64 // inbound connections closed at the handshake
	BadFrames    uint64 // inbound connections closed on a bad frame
	Delivered    uint64 // batches handed to the Receiver
	// Oversized counts messages dropped because one alone is larger than
	// Config.FrameBytesMax (each is also logged at WARN).
	Oversized uint64
}

// Transport is a multiraft.Transport over TCP.
type Transport struct {
	cfg Config
	// serverTLS and clientTLS are Config.TLS's two sides (nil without it).
	serverTLS, clientTLS *tls.Config
	log                  *slog.Logger
	stop                 chan struct{}
	wg                   sync.WaitGroup

	mu      sync.Mutex
	peers   map[uint64]*peer
	conns   map[net.Conn]struct{} // open connections, both ways, to close on Close
	inbound int                   // accepted connections open

	queueDropped, writeLost, dials, refused, badFrames, delivered, oversized atomic.Uint64
	closeOnce                                                                sync.Once
}

type peer struct {
	id   uint64
	addr atomic.Pointer[string] // the next dial's address (AddPeer may change it)
	q    chan []multiraft.Envelope
	// snaps is the snapshot lane: MsgSnap envelopes, written by a writer
	// of their own on a connection of their own, so that a large snapshot
	// never holds up the heartbeats and votes of every group behind it.
	snaps chan []multiraft.Envelope
}

// snapQueueMax bounds a peer's queued snapshot batches: raft sends a
// follower one snapshot at a time per group, and asks again for one that
// was dropped.
const snapQueueMax = 8

// New starts accepting on cfg.Listener.
func New(cfg Config) (*Transport, error) {
	if cfg.Listener == nil || cfg.Receiver == nil || cfg.NodeID == 0 {
		return nil, errors.New("raftnet: config needs a listener, a receiver and a non-zero node id")
	}
	if cfg.ClusterID == "" || len(cfg.ClusterID) > clusterIDMax {
		return nil, fmt.Errorf("raftnet: cluster id must be 1 to %d bytes", clusterIDMax)
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&cfg.FrameBytesMax, 4<<20)
	def(&cfg.SendQueueMax, 256)
	def(&cfg.InboundConnsMax, 128)
	def(&cfg.DialTimeoutMs, 2000)
	def(&cfg.WriteTimeoutMs, 2000)
	def(&cfg.BackoffMinMs, 50)
	def(&cfg.BackoffMaxMs, 2000)
	t := &Transport{
		cfg:   cfg,
		log:   cfg.Logger,
		stop:  make(chan struct{}),
		peers: map[uint64]*peer{},
		conns: map[net.Conn]struct{}{},
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if cfg.TLS != nil {
		if err := cfg.TLS.check(cfg.ClusterID, cfg.NodeID); err != nil {
			return nil, err
		}
		t.serverTLS, t.clientTLS = cfg.TLS.config(true, cfg.ClusterID), cfg.TLS.config(false, cfg.ClusterID)
	}
	t.wg.Add(1)
	go t.accept()
	return t, nil
}

// AddPeer names the address of peer node id and starts its writer.
// Adding a known peer again with another address (a node restarted on a
// new port) makes the next dial use it; the connection open now, if any,
// is kept until it fails.
func (t *Transport) AddPeer(id uint64, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if id == t.cfg.NodeID {
		return
	}
	if p, ok := t.peers[id]; ok {
		if *p.addr.Load() != addr {
			p.addr.Store(&addr)
		}
		return
	}
	select {
	case <-t.stop:
		return
	default:
	}
	p := &peer{id: id, q: make(chan []multiraft.Envelope, t.cfg.SendQueueMax),
		snaps: make(chan []multiraft.Envelope, snapQueueMax)}
	p.addr.Store(&addr)
	t.peers[id] = p
	t.wg.Add(2)
	go t.write(p, p.q)
	go t.write(p, p.snaps)
}

// Send queues batch for peer node to; see the package doc.
func (t *Transport) Send(to uint64, batch []multiraft.Envelope) {
	t.mu.Lock()
	p := t.peers[to]
	t.mu.Unlock()
	if p == nil {
		t.queueDropped.Add(1)
		t.snapshotsLost(to, batch)
		return
	}
	batch, snaps := splitSnaps(batch)
	if len(snaps) > 0 {
		select {
		case p.snaps <- snaps:
		default:
			t.queueDropped.Add(1)
			t.snapshotsLost(to, snaps)
		}
	}
	if len(batch) == 0 {
		return
	}
	select {
	case p.q <- batch:
	default:
		t.queueDropped.Add(1)
	}
}

// snapshotsLost tells this node's raft groups that their snapshots in
// batch, bound for peer, were dropped here: each group gets a MsgSnapStatus
// with Reject from that peer (raft's report of a failed snapshot), so its
// leader sends one again instead of waiting for an answer that will not
// come. A snapshot that leaves this node is answered by the peer's raft
// once applied; none is reported finished here.
func (t *Transport) snapshotsLost(peer uint64, batch []multiraft.Envelope) {
	var notes []multiraft.Envelope
	for _, e := range batch {
		if e.Msg != nil && e.Msg.Type == raftpb.MsgSnap {
			notes = append(notes, multiraft.Envelope{Group: e.Group,
				Msg: &raftpb.Message{Type: raftpb.MsgSnapStatus, From: peer, To: e.Msg.From, Reject: true}})
		}
	}
	if len(notes) > 0 {
		t.cfg.Receiver.Deliver(t.cfg.NodeID, notes)
	}
}

// splitSnaps takes the MsgSnap envelopes out of batch, for the snapshot
// lane; a batch without one (nearly all) is returned as it is.
func splitSnaps(batch []multiraft.Envelope) (rest, snaps []multiraft.Envelope) {
	i := slices.IndexFunc(batch, func(e multiraft.Envelope) bool { return e.Msg.Type == raftpb.MsgSnap })
	if i < 0 {
		return batch, nil
	}
	rest = slices.Clone(batch[:i])
	for _, e := range batch[i:] {
		if e.Msg.Type == raftpb.MsgSnap {
			snaps = append(snaps, e)
		} else {
			rest = append(rest, e)
		}
	}
	return rest, snaps
}

// Stats returns the counters.
func (t *Transport) Stats() Stats {
	return Stats{
		QueueDropped: t.queueDropped.Load(), WriteLost: t.writeLost.Load(), Dials: t.dials.Load(),
		Refused: t.refused.Load(), BadFrames: t.badFrames.Load(), Delivered: t.delivered.Load(),
		Oversized: t.oversized.Load(),
	}
}

// Close stops accepting, closes every connection and waits for the
// transport's goroutines.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		close(t.stop)
		t.cfg.Listener.Close()
		t.mu.Lock()
		for c := range t.conns {
			c.Close()
		}
		t.mu.Unlock()
	})
	t.wg.Wait()
	return nil
}

// CutConnections closes every open connection, inbound and outbound, as a
// network fault would; writers reconnect. For tests and operators alike.
func (t *Transport) CutConnections() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := range t.conns {
		c.Close()
	}
}

func (t *Transport) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.stop:
		c.Close()
		return false
	default:
	}
	t.conns[c] = struct{}{}
	return true
}

// retrack replaces a tracked connection with its TLS wrapping.
func (t *Transport) retrack(raw, c net.Conn) bool {
	t.mu.Lock()
	delete(t.conns, raw)
	t.mu.Unlock()
	return t.track(c)
}

func (t *Transport) untrack(c net.Conn) {
	c.Close()
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

func (t *Transport) accept() {
	defer t.wg.Done()
	for {
		c, err := t.cfg.Listener.Accept()
		if err != nil {
			select {
			case <-t.stop:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			t.log.Warn("raftnet: accept failed", "err", err)
			return
		}
		t.mu.Lock()
		full := t.inbound >= t.cfg.InboundConnsMax
		if !full {
			t.inbound++
		}
		t.mu.Unlock()
		if full {
			t.refused.Add(1)
			t.log.Warn("raftnet: refused peer connection", "remote", c.RemoteAddr().String(), "err", "too many inbound connections")
			c.Close()
			continue
		}
		if !t.track(c) {
			t.mu.Lock()
			t.inbound--
			t.mu.Unlock()
			return
		}
		t.wg.Add(1)
		go t.read(c)
	}
}

// read serves one inbound connection: hello, then batches.
func (t *Transport) read(c net.Conn) {
	defer t.wg.Done()
	defer func() {
		t.untrack(c)
		t.mu.Lock()
		t.inbound--
		t.mu.Unlock()
	}()
	c.SetDeadline(time.Now().Add(time.Duration(t.cfg.DialTimeoutMs) * time.Millisecond))
	var conn net.Conn = c
	// certNode and certRaftID are the node the peer's certificate names
	// (under TLS): its hello must claim that node.
	var certNode string
	var certRaftID uint64
	if t.cfg.TLS != nil {
		tc := tls.Server(c, t.serverTLS)
		if err := tc.Handshake(); err != nil {
			t.refused.Add(1)
			t.log.Warn("raftnet: refused peer connection", "remote", c.RemoteAddr().String(), "err", fmt.Errorf("%w: tls: %w", ErrHandshake, err))
			return
		}
		var err error
		if certNode, certRaftID, err = t.peerIdentity(tc); err != nil {
			t.refused.Add(1)
			t.log.Warn("raftnet: refused peer connection", "remote", c.RemoteAddr().String(), "err", err)
			return
		}
		conn = tc
	}
	br := bufio.NewReader(conn)
	payload, err := readFrame(br, clusterIDMax+32, nil)
	if err != nil {
		t.refused.Add(1)
		t.log.Warn("raftnet: refused peer connection", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	from, cluster, err := parseHello(payload)
	if err == nil && cluster != t.cfg.ClusterID {
		err = fmt.Errorf("%w: %q, this node is in %q", ErrOtherCluster, cluster, t.cfg.ClusterID)
	}
	if err == nil && t.cfg.TLS != nil && from != certRaftID {
		err = fmt.Errorf("%w: the hello claims raft id %d, the certificate names node %s (raft id %d)", ErrPeerIdentity, from, certNode, certRaftID)
	}
	if err != nil {
		t.refused.Add(1)
		t.log.Warn("raftnet: refused peer connection", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	c.SetWriteDeadline(time.Now().Add(time.Duration(t.cfg.WriteTimeoutMs) * time.Millisecond))
	if _, err := conn.Write(frame(hello(t.cfg.NodeID, t.cfg.ClusterID))); err != nil {
		return
	}
	c.SetDeadline(time.Time{})
	for {
		payload, err := readFrame(br, t.cfg.FrameBytesMax, nil)
		if err != nil {
			if errors.Is(err, ErrFrame) {
				t.badFrames.Add(1)
				t.log.Warn("raftnet: closed peer connection", "peer", from, "err", err)
			}
			return
		}
		batch, err := decodeBatch(payload)
		if err != nil {
			t.badFrames.Add(1)
			t.log.Warn("raftnet: closed peer connection", "peer", from, "err", err)
			return
		}
		t.delivered.Add(1)
		t.cfg.Receiver.Deliver(from, batch)
	}
}

// write is a writer of peer p, for the batches of q (its queue or its
// snapshot lane): it dials, says hello and writes them, on a connection
// of its own.
func (t *Transport) write(p *peer, q chan []multiraft.Envelope) {
	defer t.wg.Done()
	backoff := time.Duration(t.cfg.BackoffMinMs) * time.Millisecond
	var c net.Conn
	defer func() {
		if c != nil {
			t.untrack(c)
		}
	}()
	for {
		var batch []multiraft.Envelope
		select {
		case <-t.stop:
			return
		case batch = <-q:
		}
		for c == nil {
			var err error
			c, err = t.dial(p)
			if err == nil {
				backoff = time.Duration(t.cfg.BackoffMinMs) * time.Millisecond
				break
			}
			t.log.Debug("raftnet: dial failed", "peer", p.id, "addr", *p.addr.Load(), "err", err)
			select {
			case <-t.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Duration(t.cfg.BackoffMaxMs)*time.Millisecond)
		}
		payloads, dropped := encodeBatch(batch, t.cfg.FrameBytesMax)
		for _, d := range dropped {
			t.oversized.Add(1)
			t.log.Warn("raftnet: a message larger than a frame was dropped; raft sends it again, and will keep failing (raise FrameBytesMax)",
				"peer", p.id, "group", d.env.Group, "type", d.typ, "bytes", d.bytes, "frame_bytes_max", t.cfg.FrameBytesMax)
			t.snapshotsLost(p.id, []multiraft.Envelope{d.env})
		}
		for _, payload := range payloads {
			c.SetWriteDeadline(time.Now().Add(writeTimeout(t.cfg.WriteTimeoutMs, len(payload))))
			if _, err := c.Write(frame(payload)); err != nil {
				t.writeLost.Add(1)
				t.untrack(c)
				c = nil
				// Which of the batch's snapshots reached the peer
				// is not known: each is reported lost, and one that
				// did arrive is ignored when it comes again.
				t.snapshotsLost(p.id, batch)
				break
			}
		}
	}
}

func (t *Transport) dial(p *peer) (net.Conn, error) {
	t.dials.Add(1)
	d := time.Duration(t.cfg.DialTimeoutMs) * time.Millisecond
	addr := *p.addr.Load()
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return nil, err
	}
	if !t.track(c) {
		return nil, net.ErrClosed
	}
	c.SetDeadline(time.Now().Add(d))
	if t.cfg.TLS != nil {
		tc := tls.Client(c, t.clientTLS)
		if err := tc.Handshake(); err != nil {
			t.untrack(c)
			err = fmt.Errorf("%w: tls: %w", ErrHandshake, err)
			t.log.Warn("raftnet: refusing peer", "peer", p.id, "addr", addr, "err", err)
			return nil, err
		}
		node, rid, err := t.peerIdentity(tc)
		if err == nil && rid != p.id {
			err = fmt.Errorf("%w: %s presents the certificate of node %s (raft id %d), want raft id %d", ErrPeerIdentity, addr, node, rid, p.id)
		}
		if err != nil {
			t.untrack(c)
			t.log.Warn("raftnet: refusing peer", "peer", p.id, "addr", addr, "err", err)
			return nil, err
		}
		if !t.retrack(c, tc) {
			return nil, net.ErrClosed
		}
		c = tc
	}
	if _, err := c.Write(frame(hello(t.cfg.NodeID, t.cfg.ClusterID))); err != nil {
		t.untrack(c)
		return nil, err
	}
	payload, err := readFrame(c, clusterIDMax+32, nil)
	if err != nil {
		t.untrack(c)
		return nil, fmt.Errorf("peer %d refused or closed the handshake: %w", p.id, err)
	}
	id, cluster, err := parseHello(payload)
	if err == nil && cluster != t.cfg.ClusterID {
		err = fmt.Errorf("%w: %q", ErrOtherCluster, cluster)
	}
	if err == nil && id != p.id {
		err = fmt.Errorf("%w: %s is node %d, want %d", ErrHandshake, addr, id, p.id)
	}
	if err != nil {
		t.untrack(c)
		t.log.Warn("raftnet: refusing peer", "peer", p.id, "addr", addr, "err", err)
		return nil, err
	}
	c.SetDeadline(time.Time{})
	// The acceptor never writes again; a read that returns means the
	// connection is gone, so close it and let the next write redial.
	t.wg.Add(1)
	go func(c net.Conn) {
		defer t.wg.Done()
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}(c)
	return c, nil
}

func frame(payload []byte) []byte {
	b := make([]byte, headerBytes, headerBytes+len(payload))
	binary.BigEndian.PutUint32(b[0:4], uint32(len(payload)))
	binary.BigEndian.PutUint32(b[4:8], crc32.Checksum(payload, castagnoli))
	return append(b, payload...)
}

// readFrame reads one frame into buf's storage, bounded by max bytes.
func readFrame(r io.Reader, max int, buf []byte) ([]byte, error) {
	var h [headerBytes]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(h[0:4])
	if int64(n) > int64(max) {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrFrame, n, max)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("%w: truncated: %w", ErrFrame, err)
	}
	if crc32.Checksum(buf, castagnoli) != binary.BigEndian.Uint32(h[4:8]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrFrame)
	}
	return buf, nil
}

func hello(id uint64, cluster string) []byte {
	b := append([]byte(helloMagic), helloVersion)
	b = binary.AppendUvarint(b, id)
	b = binary.AppendUvarint(b, uint64(len(cluster)))
	return append(b, cluster...)
}

func parseHello(b []byte) (uint64, string, error) {
	if len(b) < len(helloMagic)+1 || string(b[:len(helloMagic)]) != helloMagic {
		return 0, "", fmt.Errorf("%w: not a raftnet hello", ErrHandshake)
	}
	if b[len(helloMagic)] != helloVersion {
		return 0, "", fmt.Errorf("%w: version %d", ErrHandshake, b[len(helloMagic)])
	}
	b = b[len(helloMagic)+1:]
	id, k := binary.Uvarint(b)
	if k <= 0 || id == 0 {
		return 0, "", fmt.Errorf("%w: node id", ErrHandshake)
	}
	b = b[k:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > clusterIDMax || n != uint64(len(b)-k) {
		return 0, "", fmt.Errorf("%w: cluster id", ErrHandshake)
	}
	return id, string(b[k:]), nil
}

// writeTimeoutBytesPerSec is the slowest peer link a frame's write
// deadline allows for: a frame gets Config.WriteTimeoutMs plus its size at
// this rate, so a snapshot-sized frame is not cut off like a small one.
const writeTimeoutBytesPerSec = 8 << 20

// writeTimeout is the write deadline of an n-byte frame.
func writeTimeout(baseMs, n int) time.Duration {
	return time.Duration(baseMs)*time.Millisecond + time.Duration(n)*time.Second/writeTimeoutBytesPerSec
}

// droppedMsg describes a message encodeBatch left out.
type droppedMsg struct {
	env   multiraft.Envelope
	typ   string
	bytes int
}

// encodeBatch encodes batch into payloads of at most frameMax bytes. A
// single message larger than a frame is left out and returned in dropped
// (raft sends it again; a snapshot needs a FrameBytesMax above the
// largest snapshot a partition builds).
func encodeBatch(batch []multiraft.Envelope, frameMax int) (out [][]byte, dropped []droppedMsg) {
	var cur []byte
	var count uint64
	flush := func() {
		if count > 0 {
			out = append(out, append(binary.AppendUvarint(nil, count), cur...))
		}
		cur, count = nil, 0
	}
	for _, e := range batch {
		m, err := e.Msg.Marshal()
		if err != nil {
			continue
		}
		var rec []byte
		rec = binary.AppendUvarint(rec, e.Group)
		rec = binary.AppendUvarint(rec, uint64(len(m)))
		rec = append(rec, m...)
		if len(rec)+binary.MaxVarintLen64 > frameMax {
			dropped = append(dropped, droppedMsg{env: e, typ: e.Msg.Type.String(), bytes: len(rec)})
			continue
		}
		if len(cur)+len(rec)+binary.MaxVarintLen64 > frameMax {
			flush()
		}
		cur = append(cur, rec...)
		count++
	}
	flush()
	return out, dropped
}

func decodeBatch(b []byte) ([]multiraft.Envelope, error) {
	count, k := binary.Uvarint(b)
	if k <= 0 || count > uint64(len(b)) {
		return nil, fmt.Errorf("%w: batch count", ErrFrame)
	}
	b = b[k:]
	out := make([]multiraft.Envelope, 0, count)
	for range count {
		g, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, fmt.Errorf("%w: group id", ErrFrame)
		}
		b = b[k:]
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, fmt.Errorf("%w: message length", ErrFrame)
		}
		b = b[k:]
		m := new(raftpb.Message)
		if err := m.Unmarshal(b[:n]); err != nil {
			return nil, fmt.Errorf("%w: message: %w", ErrFrame, err)
		}
		b = b[n:]
		out = append(out, multiraft.Envelope{Group: g, Msg: m})
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrFrame, len(b))
	}
	return out, nil
}
