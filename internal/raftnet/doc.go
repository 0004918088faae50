// Package raftnet is a TCP implementation of multiraft.Transport between
// peer nodes: sinew serve's raft transport in a cluster.
//
// # Connections
//
// A node dials one connection to each peer it sends to and writes every
// group's messages over it, snapshots (MsgSnap) excepted: those go on a
// second connection to the peer, the snapshot lane, so that a snapshot of
// many megabytes never holds up the heartbeats, votes and appends of the
// groups behind it. It reads the connections its peers dialed to it. So
// two nodes that talk both ways hold two connections per direction.
//
// # Wire format
//
// Every frame, the handshake included:
//
//	+----------------+-------------------+-------------------+
//	| length u32 BE  | CRC-32C u32 BE    | payload (length)  |
//	+----------------+-------------------+-------------------+
//
// The checksum covers the payload; length is at most Config.FrameBytesMax.
// The first frame on a connection is the dialer's hello:
//
//	"SNRN" version=1 u8 | node id uvarint | cluster id len uvarint | cluster id
//
// The acceptor answers with its own hello and then only reads. A hello
// naming another cluster, or a bad first frame, closes the connection and
// logs why. Every later frame is a batch:
//
//	count uvarint | count × (group uvarint | msg len uvarint | raftpb.Message)
//
// # Identity
//
// Without TLS a peer is whoever says hello, so plain TCP is for loopback
// only. With Config.TLS a peer is the node its certificate names: a URI
// subject alternative name sinew-node://<cluster id>/<node id>
// (tlsconf.PeerURI) in a certificate of the cluster's CA. The acceptor
// refuses a certificate that names no node of the cluster (a client's
// certificate of the same CA, say) at the TLS handshake, and a hello that
// claims another node than the certificate names; the dialler refuses an
// acceptor whose certificate names another node than the one it dialled.
// Either refusal is logged with its reason, the connection is closed, and
// nothing read on it reaches the Receiver.
//
// # Loss, bounds and goroutines
//
// Send never blocks: each peer has a bounded queue (Config.SendQueueMax
// batches) and a bounded snapshot lane (8 batches); a full one drops the
// batch and counts it, and a write error
// loses the batch being written; raft retransmits both. A snapshot dropped
// here (a full lane, an unknown peer, a failed write, one larger than a
// frame) is also reported to its group through Receiver.Deliver, as a
// MsgSnapStatus with Reject from the peer it was for, so the sender sends
// another at once instead of waiting for the peer's answer. At most
// Config.InboundConnsMax accepted connections are open at once, and a
// connection that has not said hello within Config.DialTimeoutMs is
// closed.
//
// Two writer goroutines per peer (its messages, its snapshots) each dial,
// with a doubling backoff bounded by Config.BackoffMaxMs, and write; one
// reader goroutine per accepted
// connection decodes and calls Receiver.Deliver, which must not block. A
// peer's bad input closes that connection, never panics. Close stops all
// of them.
package raftnet
