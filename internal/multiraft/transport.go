package multiraft

import "go.etcd.io/raft/v3/raftpb"

// Envelope is one raft message of one group. Every group's messages
// between two nodes share one stream, so each carries its group id.
type Envelope struct {
	// Group is the raft group (partition) the message belongs to.
	Group uint64
	// Msg is the raft message; Msg.To and Msg.From are replica ids, which
	// are node ids: a node holds at most one replica of a group.
	Msg *raftpb.Message
}

// Transport carries batches of envelopes from this node to peer nodes. An
// implementation keeps one connection (or stream) per peer node and sends
// every group's messages over it.
//
// Send is best effort and must not block: raft retransmits what is lost,
// so a full or broken stream drops the batch (and counts it) rather than
// stall the host. Send may keep batch; the caller must not reuse it.
type Transport interface {
	Send(to uint64, batch []Envelope)
}

// Receiver takes the batches a transport receives from peer node from.
// Host implements it. Deliver must not block.
type Receiver interface {
	Deliver(from uint64, batch []Envelope)
}
