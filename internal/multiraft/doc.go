// Package multiraft drives many raft groups on one node and carries their
// messages between nodes.
//
// # Host
//
// A Host holds every replica (Group) on its node, keyed by group id. Its
// loop (Run, or a test calling Tick, Process and Flush itself) is the only
// goroutine that calls into groups:
//
//   - Tick: one host tick gives every group one raft tick, in one pass over
//     the groups. A group that implements Quieter and reports Quiet costs
//     that one call and nothing else: a group of one is its own quorum and
//     never needs a tick, and a larger group may be quiet while its own
//     Quiescence finds it idle (a partition replica does this:
//     internal/partition). The same tick queues one node heartbeat for
//     each known peer node that nothing was queued for in the last quarter
//     of PeerLiveTicks (rounded down), whatever the number of groups: a peer that gets
//     groups' messages needs no other sign of life. Live reports a peer
//     heard from within PeerLiveTicks ticks that membership does not report
//     dead or left (SetPeerDown); when a peer's Live changes, the tick first
//     tells every LivenessWatcher group which peers changed, which is how a
//     quiet follower learns that its leader's node is gone. AddGroup hands
//     Live to a LiveUser group.
//   - Process: inbound messages wait in a bounded inbox per group
//     (Config.InboxMsgsMax); Process steps them into their group in arrival
//     order. A full inbox drops and counts (HostStats.InboxDropped): raft
//     retransmits what is lost, and a bounded drop is better than a
//     transport reader stalled behind a slow group.
//   - Flush: groups send through the function Sender returns; messages
//     queue per peer node (bounded by Config.OutboxMsgsMax, dropped and
//     counted beyond), and Flush hands each peer's queue to the Transport
//     in one Send. So the heartbeats and appends of every group for one
//     peer that are queued when the loop flushes leave together, in as
//     few transport frames as fit. Each stays a whole raft message in the
//     frame: heartbeats are batched per peer, not merged into one message.
//
// Deliver (called by a transport's reader), Sender's functions, AddGroup,
// RemoveGroup and Stats are safe from any goroutine; they take Host.mu,
// which is never held while a group or the transport is called.
//
// # Quiescence
//
// Quiescence is the policy a replica on a raft.RawNode uses for Quiet: an
// idle leader keeps heartbeating for IdleTicks ticks (so every follower
// learns the final commit index), then leader and followers stop ticking.
// There is no quiesce message: each replica decides on its own, so a
// follower that missed the last heartbeat is only behind on the commit
// index until the next append. Any message other than the known leader's
// heartbeat, or a proposal, wakes a replica. A follower whose leader's
// node stops being Live ticks again, so its election timer runs; a leader
// that restarts campaigns, and its vote requests wake the others. A leader
// may go quiet with a follower on a node that is not Live (if the rest
// make a majority); the node's return wakes it. Ticks only pace raft; they
// never decide what is committed, so quiescence cannot cost safety, only
// liveness if Live were wrong (a leader replica stopped on a node that
// stays up and keeps sending node heartbeats leaves its quiet followers
// waiting until something else wakes them).
//
// # Transport
//
// A Transport sends batches of Envelopes (a raft message tagged with its
// group id) to a peer node; an implementation keeps one stream per peer
// node for all groups. Send is best effort and never blocks.
//
// Network is the in-process implementation for tests. It drops,
// duplicates, delays and (optionally) reorders each envelope, and cuts
// links symmetrically, one way, or by isolating a node, all decided by a
// seeded random source and an injected clock. It starts no goroutine: the
// test moves time and calls DeliverDue, so a run repeats from its seed.
// One source of nondeterminism remains outside it: etcd raft (v3.6.0) draws
// its randomized election timeout from crypto/rand, which cannot be
// injected.
//
// # Durability
//
// The host persists nothing. A group persists its raft log and HardState
// before it sends the messages of the same Ready, as etcd raft requires;
// the host only moves messages, which raft may lose.
package multiraft
