// Package membership is a node's view of which other nodes are up, built on
// hashicorp/memberlist (SWIM with indirect probes and suspicion). It only
// reports: it elects nothing and decides no placement. sinew serve runs one
// in cluster mode (internal/clusternode): its view feeds the controller's
// reconciliation and the broker's self-fencing.
//
// # Timing
//
// A Profile maps the seed's SWIM table onto memberlist's knobs (see
// Profile). SeedProfile is the default: a 5 s direct probe, 3 indirect
// helpers with 3 s to answer, and a suspicion timeout of 8 s, so a crashed
// node is declared dead at most 16 s (WorstCaseDetection) after the first
// probe it fails; memberlist probes one node per probe interval, so that
// probe comes up to n-1 intervals after the crash. LANProfile probes every
// 500 ms and declares a crash dead within 1.5 s of the failed probe.
// Lifeguard's awareness multiplier is off so that these bounds hold.
//
// # View and events
//
// The view holds each peer as alive, dead or left, with its metadata (Meta:
// node id, client address, peer address, the Leaving flag and the Boot of
// its process). memberlist v0.7.0 does not expose
// suspicion: its Node.State field is never updated and no callback fires
// on suspect, so a suspect peer stays alive in this view until it is
// declared dead. A leave and a crash reach the delegate alike, so Leave
// first spreads a Leaving flag in the node's metadata, and a peer that
// disappears with that flag set is left, not dead.
//
// Events delivers transitions (join, dead, leave, fenced, unfenced). It
// never drops one silently and never blocks memberlist: at most one event
// per node waits, a newer transition of the same node replaces it and
// counts in Event.Coalesced, so the reader always learns each node's
// latest state and memory is bounded by the cluster size.
//
// # Self-fencing
//
// A node that holds more than half of its peers (those that have not left)
// dead is fenced (Fenced, EventFenced) until it sees a majority again
// (EventUnfenced). Since suspicion is not visible, fencing starts when the
// peers are declared dead, not when they become suspect.
//
// memberlist stops probing a node it holds dead, so after a partition
// heals each side would go on holding the other dead. A reconnect loop
// joins the dead peers' addresses (and the seeds and the known peers of
// SetKnownPeers while this node sees no peer alive, while it is fenced and
// for a while after start) every Profile.ReconnectInterval, at most
// reconnectPeersMax per round; the full state exchange lets each node
// refute the other side's verdict on itself.
// A dead peer stays in the view, and the loop keeps trying it, until it
// comes back.
//
// # Goroutines
//
// Besides memberlist's own, a Membership runs three goroutines, stopped by
// Close: pump (hands pending events to the reader), reconnect and
// loadLoop (sends the load reports). The view
// is updated inside memberlist's event delegate, the one place where
// memberlist's Node values may be read without a race. Membership.mu
// guards the view; it is never held while calling memberlist, and
// memberlist's delegates take only it (lock order: memberlist's node lock,
// then mu).
//
// # Load reports
//
// Every Config.LoadInterval (2 s by default) a node samples its load
// through the function SetLoadSource gave (partitions led, their ready
// and in-flight messages, records appended per second: a Load) and sends
// it to each peer alive in its view as one small memberlist user message
// over UDP, best effort (SendBestEffort; encrypted like all gossip when a
// key is set). A peer keeps the last report of each alive peer with the
// time it arrived; Loads gives them with their age, and FreshLoads drops
// those older than three intervals, so a peer whose reports stop (lost,
// a node of an older version, no source set) falls back to having none.
// A report is dropped when it does not decode (Stats.BadLoads), names a
// node not alive in the view, or is not newer than the kept one of the
// same run (Load.Boot, Load.Seq).
//
// Why a message of its own rather than memberlist's other channels: the
// node metadata would need UpdateNode, which bumps the node's incarnation
// and gossips an alive message through the cluster at every change, and
// a new metadata version that older nodes refuse; LocalState and
// MergeRemoteState ride only the full state exchange (every 30 s); a
// ping's ack payload reaches a peer only when that peer probes this node
// (every (n-1) probe intervals, 8 s each under SeedProfile); queued
// broadcasts reach only a few random peers unless every peer relays them.
// A direct report costs one packet (a dozen bytes and the node id) per peer per
// interval, with no retransmission and no state beyond the last report.
// Reports are advisory: nothing here fences, elects or refuses on them.
//
// # Durability
//
// Nothing here is persisted.
package membership
