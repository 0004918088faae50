// Package partition runs one queue partition as an actor.
//
// # Files
//
// Each file holds one part of the partition:
//   - partition.go: Config, the Partition and its internal types; Open.
//   - api.go: the methods other goroutines call (publish, settle, attach,
//     detach, purge, close); each only queues work for the actor.
//   - inbox.go: the bounded command inbox.
//   - decider.go: the deterministic half of a turn (no I/O, no clock).
//   - actor.go: the actor loop and its turns (leader, follower, transfer).
//   - stage.go: the pipeline's stages, the syncer and what a sync releases.
//   - deliver.go: deliveries, body reads and dead-letter copies.
//   - checkpoint.go, ackfile.go, relocate.go, memory.go: the store
//     (checkpoints, the ACK memory's file, segment retention, memory a
//     quiet partition gives back); ackmemory.go is the ACK memory itself.
//   - raft.go: the raft driver (Ready handling, storage, the raft inbox).
//   - leadership.go: gaining, losing and handing over the lead, and
//     membership changes; handover.go, progress.go, quiesce.go and
//     snapshot.go serve it.
//   - cache.go, inspect.go, observe.go: the body cache, Peek and Discard,
//     counters.
//
// # Goroutines and ownership
//
// Open starts ONE actor goroutine per partition. It alone owns the
// partition's queue.State and its raft node (see Raft), appends to its
// seglog.Log, keeps its timers, its
// consumer list, its cache of recent payloads (which another partition's
// goroutine may make give back, under its lock, when the node's budget is
// full: see cache.go) and its dead-letter bookkeeping. Beside it run goroutines that own nothing: a syncer,
// which on request makes the log durable (persist) and reports back, so the
// actor can work while the disk syncs; and, while one is under way, a
// checkpointer, which writes the checkpoint the actor took (see
// Durability) and ends. Other goroutines reach the
// actor through:
//
//   - the inbox, a bounded queue of publishes, settles and purges, whose
//     buffer grows as they arrive (an idle partition reserves none). A
//     full inbox (Config.InboxMax waiting) is answered at once with
//     ErrInboxFull (CodeResourceExhausted); it never holds more.
//   - the control list: attach, detach, dead-letter confirmations, claims
//     of recovered leases and configuration changes, which must not be
//     refused for lack of room. Each comes from a bounded source (one per
//     subscription, or one per in-flight dead-letter copy).
//   - Poke, which asks for a turn (credit came back, the clock moved).
//
// # A turn
//
// A turn has a deterministic half and an I/O half (decider.go). The
// decider decides: control messages, commands and the clock go in; queue
// events applied to the state, records numbered with their LSNs, and the
// stage's replies, deliveries and dead letters come out. It does no I/O and
// reads no clock, and datadriven scenarios (testdata/decider) test it
// alone. The driver around it (actor.go, raft.go) takes the inbox, proposes
// the decided records to raft, which appends them to the log, syncs, reads
// bodies and checkpoints.
//
// The actor takes a batch of commands (at most batchMax) and then:
//
//  1. applies control messages (a detached consumer's leases are released,
//     or kept for a while with DetachKeeping);
//  2. releases recovered leases whose grace has ended, and kept leases
//     whose keep has ended;
//  3. turns every command into queue events and applies each to the state
//     (the records are appended to the log at the end of the turn, before
//     anything reads them);
//  4. carries purges under way forward, at most purgePerTurnMax messages
//     per turn (a purge of a larger backlog continues in the next turns and
//     is answered with its count once its last discards are durable);
//  5. ticks the queue (lease expiry, delays, TTL);
//  6. dispatches: leases ready messages to consumers with prefetch credit,
//     round-robin in small chunks so competing consumers share the queue.
//
// Replies, deliveries and dead-letter starts do not leave the turn: they
// go into the open stage of the pipeline.
//
// # The pipeline
//
// Records reach the disk in stages. A stage collects the replies,
// deliveries and new dead letters of one or more consecutive turns, and one
// sync makes all of its records durable:
//
//	turns:    [ T1 ]      [ T2 ][ T3 ]                [ T4 ] ...
//	syncer:         [ sync stage{T1} ]  [ sync stage{T2,T3} ]   ...
//	released:                        ^ T1               ^ T2, T3
//
// At most one sync is under way (the syncing stage). Meanwhile the actor
// keeps taking batches: it decides, appends and applies them into the open
// stage, which holds at most stageCommandsMax commands (then the actor
// waits for the sync and the inbox absorbs the rest). When the sync
// returns, raft is told its entries are durable and the stage waits for
// raft to commit them (at once in a group of one; on a quorum's
// acknowledgement in a larger group, with at most committingStagesMax
// stages waiting). Once committed the stage is released: its publishers and settlers are
// answered, its leases delivered (payloads from the body cache, or read in
// runs of nearby offsets with one seglog.ScanRange), the holders of leases
// that ended told (Consumer.LeaseEnded), its dead-letter copies started.
// A lease that ended before its stage was released (it expired meanwhile)
// is not delivered; its credit is refunded instead. The actor then yields once, so the publishers and settlers it
// just answered can send their next command in time, takes the inbox, and
// the open stage becomes the syncing one. A stage that appended nothing (only
// refusals or idempotent answers) needs no sync but is still released after
// the stage before it, so answers never overtake the records they depend
// on. A failed append or sync fails the partition: the open stage is
// refused, and the syncing stage gets the outcome of its own sync (records
// that reached the disk before the failure are confirmed truthfully).
//
// # Raft
//
// The log is the partition's raft log (internal/raftlog over seglog v2):
// every queue event is one raft entry, so an offset is a raft index, and a
// new leader's empty entry or a configuration change is an index the queue
// counts as a settled gap. A single node runs every partition as a raft
// group of one (Config.RaftPeers empty), which elects itself during Open;
// a larger group is driven by a multiraft host through Step, Tick, Quiet
// and Leader, and sends through Config.Send.
//
// The raft.RawNode runs with asynchronous storage writes. At the end of a
// turn the leader proposes the turn's records in one message, and raft's
// Ready hands them back as a MsgStorageAppend, whose entries are appended
// to the log (buffered) and counted in the open stage; its responses wait
// for that stage's sync and are then stepped back, which in a group of one
// commits the entries. The MsgStorageApply that follows carries the
// committed entries: the stages they complete are released. A HardState
// with a new term or vote is synced before raft hears of it; a commit index
// alone is written at checkpoints and at Close, since a commit index that
// rolls back costs only replay. The commit index written is never past what
// the replica applied: a follower hears of a commit index together with
// entries it has not synced yet, and a HardState that outlived them would
// claim more than the log holds. raft keeps the data of an entry proposed
// to it without copying it (in its log, its entry cache and its messages
// to followers). Every group, a group of one too, proposes its records
// with their data (propose): a publish's own framed buffer, which nothing
// changes afterwards, as it is; a record decided into the turn's arena,
// which is reused after the turn, as a copy.
//
// Only committed entries are applied on a follower. The leader decides on
// a state that also holds its own proposals not yet committed (the
// overlay), so it never leases or settles a message twice; nothing of
// them leaves the partition before they commit. When it loses the lead (or
// raft refuses a proposal), it drops the overlay: the state is rebuilt
// from the checkpoint and the log up to the commit index, every request
// still waiting is answered ErrNotLeader (its entry may yet commit under
// the next leader, or be replaced), and its consumers are detached. A
// replica that becomes leader first applies the rest of its log (entries
// of earlier terms that its first entry will commit) and treats the leases
// in it as recovered ones. A follower refuses publishes and settles with
// ErrNotLeader.
//
// The lead moves on purpose too (Reconfigure): a leader the placement no
// longer names hands it to a caught-up wanted voter, and a leader that is
// not the preferred owner hands it to that one once it has been caught up
// for a hold-down (Config.PreferredOwnerHoldTicks, counted in raft ticks;
// two election timeouts under a group's first leader while none of its
// caught-up voters has fallen behind, so that a queue created while the
// cluster forms still spreads its owners), its node alive all along as the
// cluster's membership sees it (Config.PeerAlive: a fenced node is caught up
// over raft but would hand the lead straight back).
// raft drops every proposal while a transfer is under way, so the actor
// then decides nothing (transferTurn): commands are refused with
// ErrNotLeader, control messages that would decide records wait, and so do
// deadlines, dispatch and checkpoints, until the transferee leads (this
// replica steps down as above) or raft gives the transfer up after an
// election timeout. Should raft drop a proposal of a replica that still
// leads anyway, its overlay is dropped and rebuilt as the new leader's is
// (proposalDropped).
//
// Recovery replays to the commit index stored in the
// HardState; in a group of one every record in the log is committed, since
// its one voter holds it, so it replays to the end. A larger group's
// leader checkpoints only when nothing it decided is uncommitted, so a
// checkpoint never claims an entry that another leader could replace.
// etcd raft panics when its storage fails (a read error); every call into it
// recovers that panic as the partition's failure, so one failing disk read
// stops one partition and not the broker.
//
// A replica installs a raft snapshot in steps (the checkpoint, then a log
// restarted at the snapshot's body floor, then a sync), none of which alone
// leaves a consistent disk. The snapshot is first written whole to
// Dir/snapshot.pending; recovery that finds it stores it again, and the
// file goes once the log is synced and a reset record in the node journal
// (wal.Batch.Reset) has voided the group's entries from before the
// snapshot, so recovery never merges them into the new log.
//
// The datadriven scenarios in testdata/replica run a group of three real
// partitions on the in-process fault-injecting network (multiraft.Network)
// and print, step by step, each replica's raft role, term, commit index,
// applied index, checkpoint and log terms, its queue, and what clients were
// answered: an election, replication and quorum confirmation, a leader's
// power loss, the truncation of a deposed leader's suffix, and a replica
// caught up by snapshot.
//
// # Quiet groups
//
// A replica of a larger group stops taking ticks while its group is idle
// (quiesce.go): at each host tick with ticks for it, after stepping what
// arrived, it asks multiraft.Quiescence, with the host's Live (handed over
// by AddGroup through UseLive), whether it may be quiet, and Quiet then
// tells the host to skip it. It stays awake while stages wait for a quorum,
// while a leadership transfer runs, and on a leader whose preferred owner
// has caught up (the hold-down counts ticks). A proposal, a configuration
// change, a transfer or a new preferred owner wakes it on the actor; a
// raft message other than its leader's heartbeat wakes it before it is
// stepped; a change in the liveness of a node of its group
// (LivenessChanged, on the host loop) asks the actor to wake it at its next
// turn. Reconfigure of a quiet leader whose voters already are the
// placement takes no turn (QuietPlaced).
//
// # Carried credit
//
// A consumer at its prefetch gets credit back only when its settle is
// answered, so each message cycle would cost two syncs: the settle's, then
// the next lease's, decided in a later turn. A settle sent with SettleFor
// by the consumer holding the lease carries the lease's credit over
// instead (CreditCarrier): as the ending record is appended the consumer
// hands the credit to the open stage, whose dispatch spends it on that
// consumer's next leases, so one sync covers the settle and the lease.
// Carried credit is spent only within its stage and what is left goes back
// with RefundCredit when the stage is released, after its replies. As a
// stage releases replies before deliveries, the consumer is told its settle
// succeeded before it is handed the delivery that credit paid for: what it
// holds as it observes it never exceeds its prefetch.
//
// The state machine runs ahead of the disk by at most one stage: a later
// turn may lease a message whose Enqueue record is still being synced. That
// is safe because nothing leaves the actor before its stage is durable, and
// a crash loses the undurable stage's state and records together.
//
// # Durability
//
// Nothing is confirmed before its record is durable, and nothing is
// delivered before its Enqueue and Lease records are: replies and
// deliveries happen only when their stage is released. The broker runs
// every partition through the node journal (below): durable then means the
// journal's fdatasync. A partition opened without one (Config.WAL nil, as
// in this package's own tests) syncs its log per stage; under
// seglog.SyncInterval the syncer calls log.Flush instead of log.Sync: a
// stage's records are written to the OS before anything in it is confirmed,
// so a process crash loses nothing confirmed, and fdatasync runs every
// SyncIntervalMs, so a power loss can lose up to one interval of confirmed
// records (the risk that policy names). Every CheckpointEveryRecords records
// (a leader counts those it proposes, a follower those it appends; a
// follower's checkpoint covers what it applied, which is committed) and at
// Close the queue snapshot is written to Dir/checkpoint atomically
// (after a log.Sync, so it never claims a record that is not durable); log
// segments wholly below both the checkpoint and every live message's body
// are then deleted. The actor only takes the checkpoint: it encodes the
// queue and dedup snapshots in memory and notes the retention floor. The
// checkpointer goroutine then syncs the log, writes the file (write, fsync,
// rename, directory fsync) and drops the segments, while the actor keeps
// serving; at most one checkpoint is under way, and records appended
// meanwhile count towards the next one. Close awaits the one under way and
// writes the last itself. Just before, the bodies of the few live messages left
// in sparse old segments are copied to the log's tail (queue Relocate
// records, see relocate.go), so one long-delayed or stuck message does not
// pin every segment after it. A failed checkpoint is counted
// (Stats.CheckpointFailures), logged once and retried only after a backoff
// that doubles from 1 s to 5 min with each consecutive failure. Recovery
// restores the checkpoint and replays the log from the LSN it covers. Close
// waits for the sync under way, makes the open stage durable and releases
// both.
//
// With the node journal (Config.WAL, internal/wal) the syncer commits the
// stage's entries to the journal, whose one fdatasync is shared with every
// other partition on the node; a confirm, and a follower's append response,
// then mean the journal's fsync. The log is the partition's store: opened
// with seglog.SyncManual, it takes the entries in memory, writes them to the
// OS in batches of up to storeBufferBytes (or every storeWriteIntervalMs, or
// when a read needs them) and fsyncs only at checkpoints, on
// Partition.ReleaseWAL (the journal's pressure call) and at Close. Each of
// those, and each raft snapshot install, then releases the journal up to
// what the log holds durably. Recovery first merges what the journal
// replayed for the group (mergeWAL: the journal holds the last write of
// every index it has, so it wins over the log), syncs the log and releases
// the journal, then proceeds as without one. A term or vote change goes
// through the journal too: it is committed with the open stage (whose
// responses, a vote among them, wait for that fsync) and written to the
// log's own HardState file without an fsync; recovery takes the journal's
// when it is newer (mergeWALHardState).
//
// # Recovered leases
//
// Leases found in the log at Open were granted to sessions of the previous
// process, which are gone. The actor lists them after recovery and, once
// Config.RecoveredLeaseGraceMs has passed on its clock (on the first turn
// by default), releases every one that is still current: ready again, the
// attempt counted as for any requeue, at most recoveredReleasePerTurnMax
// per turn. Adopt is how a restored session takes its leases back within
// the grace: a consumer whose Owner is the one in the log becomes their
// holder and gets each delivered again (same lease id and attempt), and
// the grace no longer releases them. Leases past their deadline are not
// adopted; they expire as usual. ClaimRecovered only takes them off the
// release list.
//
// # Dead letters
//
// When a DeadLetter event with a target is durable, the actor publishes a
// copy (through Config.DeadLetter) carrying the reserved sinew.* headers,
// and records DeadLetterDone once the target confirms it. Copies still
// pending at a crash are redone after recovery (queue.PendingDeadLetters),
// so a copy may be made twice but is never lost.
//
// # Damage
//
// Open returns an error wrapping ErrDamaged when the log or checkpoint fails
// verification. The caller may quarantine the partition (Parked), refuse to
// start, or reopen with seglog.CorruptionTruncate. A write or fsync error
// at run time fails the partition: it refuses everything with
// ErrUnavailable until the process restarts, because its in-memory state
// may be ahead of the disk.
//
// # Producer deduplication
//
// The actor also owns a dedup.Table. A publish with a producer id is
// checked against it before it is stored: a remembered sequence is answered
// with its original offset and duplicate = true and stores nothing, one
// below the producer's window is refused with ErrSequenceTooOld. A stored
// one is recorded as its Enqueue record (which carries the producer id and
// sequence) is applied, and again when recovery replays that record. The
// duplicate answer is a reply of the open stage, so it is never given
// before the original's record is durable; if that sync fails, the
// partition fails and the next Open rebuilds the table from the durable log
// alone, so a store that never became durable is never reported as seen.
// The table is written in the checkpoint beside the queue snapshot, so a
// sequence stays remembered after its message was acked and retention
// dropped its segment.
//
// PublishAfter adds the ordering link of docs/protocol.md: a publish that
// names the producer's previous sequence is refused with ErrOutOfSequence,
// storing nothing, until the table holds that sequence. The check runs on
// the actor against the state decided so far, so a follower is never
// decided before its predecessor's record, and a leader change that drops
// the predecessor's uncommitted record drops the follower's with it.
//
// # Inspection and counters
//
// Peek runs on the actor between two turns (a control message), walks at
// most PeekScanMax offsets from the settled frontier or the offset asked,
// and returns the unsettled messages with their state; it appends nothing
// and leases nothing. Discard removes one queued message with the record
// a purge writes for it, answered once that record is durable. Every
// applied event is counted in Config.Counters (atomics, shared by all the
// partitions of a broker), and the syncer reports each sync that made a
// stage durable to Config.OnSync: the operator's metrics read these.
package partition
