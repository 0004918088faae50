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
//     that one call and nothing else. Today only a partition that is a
//     group of one reports Quiet (it is its own quorum and never needs a
//     tick); a partition of a larger group and the controller's group tick,
//     and so heartbeat, on every host tick, idle or not. The same tick
//     queues one node heartbeat per known peer node, whatever the number of
//     groups; Live reports a peer heard from within PeerLiveTicks ticks.
//   - Process: inbound messages wait in a bounded inbox per group
//     (Config.InboxMsgsMax); Process steps them into their group in arrival
//     order. A full inbox drops and counts (HostStats.InboxDropped): raft
//     retransmits what is lost, and a bounded drop is better than a
//     transport reader stalled behind a slow group.
//   - Flush: groups send through the function Sender returns; messages
//     queue per peer node (bounded by Config.OutboxMsgsMax, dropped and
//     counted beyond), and Flush hands each peer's queue to the Transport
//     in one Send. So the heartbeats and appends of every group for one
//     peer leave together, once per loop turn.
//
// Deliver (called by a transport's reader), Sender's functions, AddGroup,
// RemoveGroup and Stats are safe from any goroutine; they take Host.mu,
// which is never held while a group or the transport is called.
//
// # Quiescence
//
// Quiescence is a policy a replica on a raft.RawNode can use for Quiet. No
// replica in Sinew uses it yet: it is exercised by this package's own tests
// (replica_test.go, replq_test.go), and partitions of larger groups do not
// go quiet. With it, an idle leader keeps heartbeating for IdleTicks ticks
// (so every follower learns the final commit index), then leader and
// followers stop ticking.
// Any message other than a heartbeat, or a proposal, wakes a replica. A
// follower whose leader's node stops being Live ticks again, so its
// election timer runs; a leader that restarts campaigns, and its vote
// requests wake the others. Ticks only pace raft; they never decide what
// is committed, so quiescence cannot cost safety, only liveness if Live
// were wrong.
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
