package partition

import (
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/budget"
	"github.com/sinewmq/sinew/internal/dedup"
	"github.com/sinewmq/sinew/internal/delivery"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/internal/wal"
	"github.com/sinewmq/sinew/protocol"
)

// Limits and defaults.
const (
	// InboxMaxDefault is Config.InboxMax when left zero.
	InboxMaxDefault = 4096
	// CheckpointEveryRecordsDefault is Config.CheckpointEveryRecords when
	// left zero.
	CheckpointEveryRecordsDefault = 100_000
	// BodyCacheBytesDefault is Config.BodyCacheBytes when left zero.
	BodyCacheBytesDefault = 4 << 20
	// batchMax caps the commands one turn takes from the inbox, so one
	// turn's fsync never waits on an unbounded amount of work.
	batchMax = 1024
	// stageCommandsMax caps the commands the open stage collects while a
	// sync is under way; past it the actor stops taking commands until
	// the sync returns.
	stageCommandsMax = 4096
	// dispatchPerTurnMax caps the leases one turn hands out; when reached
	// the actor schedules another turn at once instead of growing the turn.
	dispatchPerTurnMax = 4096
	// fairChunkMax is the most messages one consumer is leased before the
	// next consumer with credit gets its turn.
	fairChunkMax = 8
	// deadLetterInflightMax bounds dead-letter copies awaiting their
	// target's confirmation.
	deadLetterInflightMax = 256
	// purgePerTurnMax caps the messages one turn purges; a larger backlog
	// is purged over the turns right after it.
	purgePerTurnMax = 4096
	// recoveredReleasePerTurnMax caps the recovered leases one turn hands
	// back; the rest go in the turns right after it.
	recoveredReleasePerTurnMax = 1024
	// detachKeepMsMax caps how long DetachKeeping keeps a detached
	// consumer's leases (10 minutes).
	detachKeepMsMax = 600_000
	// readGapMax is the widest gap, in LSNs, between two leased offsets
	// that delivery still reads with one sequential scan: the records in
	// between are read and skipped, which beats a separate read per
	// message while the gap is small.
	readGapMax = 256
	// deadLetterRetryMs is how long a failed dead-letter copy waits before
	// it is tried again.
	deadLetterRetryMs = 1000
	// checkpointRetryMinMs and checkpointRetryMaxMs bound the wait after a
	// failed checkpoint: it doubles from the minimum with each consecutive
	// failure up to the maximum, so a full or broken disk costs one
	// snapshot and fdatasync per step instead of one per turn.
	checkpointRetryMinMs = 1000
	checkpointRetryMaxMs = 5 * 60 * 1000
	// idleCheckpointMs: a partition that appended records since its last
	// checkpoint and then had nothing to do for this long checkpoints, so
	// that retention (and relocation) run without waiting for
	// CheckpointEveryRecords more records that may never come.
	idleCheckpointMs = 10_000
	// rotateBytesMin: when a checkpoint finds that nothing in the log is
	// needed any more and the active segment holds at least this much, it
	// starts a new segment so the old one can be deleted. Below it the file
	// is not worth replacing.
	rotateBytesMin = 256 << 10
	// controlMax bounds attach/detach/dead-letter-done messages waiting for
	// the actor. Each is produced by a bounded source (a subscription, or a
	// dead-letter copy counted against deadLetterInflightMax), so the bound
	// is a backstop, not a flow control.
	controlMax = 1 << 16
	// logDir and checkpointFile name the partition's files in Config.Dir.
	logDir         = "log"
	checkpointFile = "checkpoint"
)

// Errors. Each is a *protocol.Error so callers can hand its code to a peer.
var (
	// ErrInboxFull: the bounded inbox is full; the caller should back off.
	ErrInboxFull = &protocol.Error{Code: protocol.CodeResourceExhausted, Message: "partition inbox full"}
	// ErrClosed: the partition is closed (the broker is stopping).
	ErrClosed = &protocol.Error{Code: protocol.CodeShuttingDown, Message: "partition closed"}
	// ErrUnavailable: the partition is quarantined or failed and serves
	// nothing.
	ErrUnavailable = &protocol.Error{Code: protocol.CodeUnavailable, Message: "partition unavailable"}
	// ErrSequenceTooOld: a publish repeats a producer sequence below the
	// producer's deduplication window; it may have been stored, so it is
	// refused rather than stored again (see internal/dedup).
	ErrSequenceTooOld = &protocol.Error{Code: protocol.CodeSequenceTooOld, Message: "producer sequence is below the deduplication window"}
	// ErrOutOfSequence: a publish names a predecessor (PublishAfter) that
	// the partition does not hold yet; nothing was stored.
	ErrOutOfSequence = &protocol.Error{Code: protocol.CodeOutOfSequence, Message: "the producer's previous publish is not stored yet"}
	// ErrDamaged is wrapped by Open when the log or checkpoint fails
	// verification: the partition must be quarantined, refused or
	// reopened with seglog.CorruptionTruncate.
	ErrDamaged = errors.New("partition: damaged log or checkpoint")
)

// WAL is the part of a per-node write-ahead log (*wal.WAL) a partition
// uses: Commit makes a batch of its entries durable, Release says its own
// log holds entries up to index durably; Mark and ReleaseSince do the same
// from a goroutine other than the actor, where an overwrite may come
// between the log's sync and the release.
type WAL interface {
	Commit(group string, b wal.Batch) error
	Release(group string, index uint64)
	Mark(group string) uint64
	ReleaseSince(group string, index, mark uint64)
}

// Config configures one partition.
type Config struct {
	// Topic, Group and Index identify the partition in logs and in
	// dead-letter headers.
	Topic, Group string
	Index        uint32
	// Dir holds the partition's log (Dir/log) and checkpoint.
	Dir string
	FS  vfs.FS
	// Now is the clock; default time.Now. The actor sleeps until the
	// queue's next deadline with a time.Timer, so tests that inject a
	// clock either run in a testing/synctest bubble or call Poke after
	// moving their clock.
	Now    func() time.Time
	Logger *slog.Logger
	// LeaseIDs draws the id of each lease this partition grants; nil
	// means NewLeaseIDs. A settle is accepted on the strength of its lease
	// reference, so the ids must be ones no client can predict; tests
	// inject a deterministic source.
	LeaseIDs func() uint64
	// Queue is the queue configuration; DeadLetter.Target is already
	// resolved to a queue name ("" discards).
	Queue queue.Config
	// Dedup bounds the producer deduplication window; zero fields take
	// dedup's defaults.
	Dedup dedup.Config

	Sync           seglog.SyncPolicy
	SyncIntervalMs int
	// WAL, when not nil, is the node's shared write-ahead log: each stage's
	// entries are handed to the OS through the partition's own log (no
	// fsync) and made durable by one WAL.Commit, so many partitions share
	// one fdatasync (Sync and SyncIntervalMs are then ignored for entries).
	// WALGroup names the partition in it (its directory, stable across
	// restarts) and WALReplay is what the WAL replayed for it at open;
	// recovery copies the entries the log lacks into the log, syncs it and
	// releases the WAL. Nil: the partition fsyncs its own log.
	WAL          WAL
	WALGroup     string
	WALReplay    *wal.Group
	SegmentBytes int64
	Corruption   seglog.CorruptionPolicy
	// Preallocate picks how log segments get their space (see
	// seglog.PreallocMode); the zero value is seglog's default.
	Preallocate seglog.PreallocMode

	InboxMax               int
	CheckpointEveryRecords int
	// BodyCacheBytes bounds the cache of recently published payloads
	// when BodyBudget is nil; negative disables it.
	BodyCacheBytes int
	// BodyBudget and RaftBudget, when set, are node-wide budgets (see
	// internal/budget) that the body cache and the raft entry cache
	// share with every other partition on the node, instead of
	// BodyCacheBytes and raftlog's own bound.
	BodyBudget, RaftBudget *budget.Budget
	// RecoveredLeaseGraceMs is how long leases found in the log at Open
	// keep their holders after the restart. Their holders' sessions did
	// not survive it, so once the grace has passed every recovered lease
	// that is still current is released (queue.Release: ready at once,
	// not counted towards the retry limit) instead of waiting for its
	// deadline. 0 releases them on the first turn. ClaimRecovered exempts
	// an owner's leases within the grace.
	RecoveredLeaseGraceMs int64

	// DeadLetter publishes a dead-letter copy m to the queue named target.
	// It must not block, and must call done exactly once (from any
	// goroutine) when the copy is durable or has failed. nil makes every
	// copy fail, so messages stay dead-lettering until a restart with a
	// working callback.
	DeadLetter func(target string, m *queue.Message, done func(error))

	// Counters, when set, is where the partition counts its events; a
	// broker shares one among all its partitions. nil: the partition
	// counts into its own.
	Counters *Counters
	// OnSync, when set, is told of every sync that made a stage durable.
	OnSync SyncObserver
	// OnStir, when set, is called (from any goroutine; it must not block)
	// each time a quiet replicated group wakes: a proposal, a
	// configuration change, an election, a node's liveness. The broker's
	// placement pass slows down while every group is quiet and speeds up
	// again at this call.
	OnStir func()

	// RaftID is this replica's id in the partition's raft group; 0 means
	// 1. RaftPeers are the group's voters when it was created (also for a
	// replica added later, which replays the group's configuration changes
	// from there, or gets a snapshot that carries the current one); empty means
	// {RaftID}, a group of one, which is how a single node runs every
	// partition. Send carries raft messages to the other replicas (nil
	// for a group of one).
	RaftID    uint64
	RaftPeers []uint64
	// CampaignAtStart makes a replica of a new group (an empty log)
	// campaign at once, so the group's preferred owner leads it first
	// instead of whoever's election timer fires first.
	CampaignAtStart bool
	Send            func([]*raftpb.Message)
	// Replicated runs the group's raft over Send and the host's ticks even
	// while it has one voter (a cluster's queue placed on one node, which
	// the controller grows by adding replicas); without it a group of one
	// runs inline on its own goroutine and can never grow.
	Replicated bool
	// PreferredOwnerHoldTicks is the hold-down, in raft ticks, before a
	// leader hands its partition back to the placement's preferred owner
	// (Reconfigure): the preferred replica must have been a caught-up
	// voter for that long without a break, so that a node restarted after
	// a crash does not take the lead back at once. 0 means
	// PreferredOwnerHoldTicksDefault.
	PreferredOwnerHoldTicks int
	// PeerAlive, when set, reports whether the node of replica raftID is
	// alive as the cluster's membership sees it. A leader counts the
	// preferred owner's hold-down only while it is (sampleCaughtUp): a
	// fenced node, caught up over raft while its peers see it dead, does
	// not get the lead back, only to hand it over again. nil: every
	// replica's node counts as alive.
	PeerAlive func(raftID uint64) bool
	// SurvivorsDurable says that the node synced its whole file system
	// (vfs.SyncAll) after the last process that wrote this partition
	// ended: what that process left (a crash's unsynced writes, the
	// directories it made) is durable, and recovery does not sync it file
	// by file. Only for a partition opened at a node's start.
	SurvivorsDurable bool
	// Fenced, when set, reports whether this node sees a majority of the
	// cluster's nodes dead. While it does, the replica sends no pre-vote
	// requests, so it never wins an election its timer starts: a node cut
	// off from its peers' gossip may still reach their raft, be elected
	// and only hand the lead over again (a leader on a fenced node hands
	// its lead over itself). It still votes, follows a leader and takes a
	// lead handed to it. nil: never fenced.
	Fenced func() bool

	// noRetention keeps every log segment (tests compare checkpoint plus
	// replay with a replay of the whole log).
	noRetention bool
	// relocateLiveFraction overrides relocateLiveFraction (tests: 1
	// relocates every live body of the sealed segments, -1 none).
	relocateLiveFraction int
	// raftCacheBytes overrides the raft log's entry cache bound (tests:
	// 1 makes raft read committed entries back from the log).
	raftCacheBytes int
	// snapshotStep, when set, is called after each durable step of a raft
	// snapshot install (tests: a power loss between two of them).
	snapshotStep func(step string)
}

// SettleOp is how a consumer settles a lease.
type SettleOp uint8

// Settle operations.
const (
	Ack  SettleOp = iota + 1 // done: settled
	Nack                     // redeliver, not before the given time
	Fail                     // dead-letter now
	// Extend moves the current lease's deadline (ExtendFor); it settles
	// nothing.
	Extend
)

// Consumer is a subscription as one partition sees it. All methods are
// called from the partition's goroutine and must not block.
type Consumer interface {
	// Owner is recorded in lease records; Detach releases every lease
	// held under it.
	Owner() string
	// TakeCredit reserves up to max deliveries from the consumer's
	// prefetch budget and returns how many it got.
	TakeCredit(max int) int
	// RefundCredit gives back reserved credit that was not used.
	RefundCredit(n int)
	// Deliver hands over one message whose lease is durable.
	Deliver(d Delivery)
	// LeaseEnded tells the consumer that a lease it was granted is no
	// longer current: settled (by anyone), expired, released or
	// dead-lettered. It comes after the Deliver of that lease (or instead
	// of it, when the lease ended before it could be delivered, in which
	// case RefundCredit already returned its credit) and once the event
	// that ended it is durable. A consumer that counts deliveries against
	// a prefetch budget frees the lease's credit here unless its own
	// settle already did: a lease that expires in a consumer's hands must
	// not hold that consumer's credit forever.
	LeaseEnded(offset, leaseID uint64)
	// Detached tells the consumer the partition stopped serving it
	// because the partition failed.
	Detached(err error)
}

// CohortMember is a Consumer that consumes as a member of a cohort. The
// partition's gate (queue.Gate) admits it only while the partition is
// assigned to it; a Consumer that is not a CohortMember is a plain one,
// served while the gate is open.
type CohortMember interface {
	// Cohort returns the cohort and the member id the consumer is.
	Cohort() (cohort, member string)
}

// GateWatcher is a Consumer that is told where the partition's gate
// stands: once when it attaches, and each time the gate moves, after the
// move is durable. Called on the partition's goroutine; must not block.
type GateWatcher interface {
	GateMoved(g queue.Gate)
}

// CreditCarrier is a Consumer that lets a settle's freed credit lease its
// next message in the same stage, which saves a whole sync per message
// cycle when the consumer is at its prefetch.
//
// When a settle sent with SettleFor(c, ...) ends a lease c holds, the actor
// calls c.CarryCredit(offset, leaseID) as it appends the ending record. If
// it returns true, c hands the delivery's credit to the partition instead
// of returning it when the settle is answered, and the partition spends it
// on leases for c in the same stage, or gives it back with RefundCredit
// when the stage is released. A stage is released replies first, then
// deliveries: c is told its settle succeeded before it is handed the
// delivery that credit paid for, so the deliveries c has been handed and
// not yet seen settled never exceed its prefetch.
type CreditCarrier interface {
	CarryCredit(offset, leaseID uint64) bool
}

// Delivery is one leased message (internal/delivery). A partition fills in
// everything but Partition, Topic and Group, which the broker adds;
// ExpiresAtMs and Epoch only on a replica of a larger group.
type Delivery = delivery.Delivery

// Stats are a partition's counters as of the end of its last turn.
type Stats struct {
	queue.Stats
	Consumers   int
	Quarantined bool
	Err         string
	// CheckpointFailures counts failed checkpoint attempts since Open.
	// After a failure the next attempt waits (see checkpointRetryMinMs);
	// the log keeps growing meanwhile, since retention runs only after a
	// checkpoint.
	CheckpointFailures uint64
	// Relocated counts message bodies copied to the log's tail since Open
	// so that retention could drop the old segments they pinned.
	Relocated uint64
	// Dedup counts the producers and sequences the deduplication window
	// remembers, and the producers it forgot since Open.
	Dedup dedup.Stats
	// Duplicates counts publishes answered with the offset of an earlier
	// store of the same producer sequence since Open.
	Duplicates uint64
	// Gate is who the partition delivers to (see queue.Gate).
	Gate queue.Gate
	// BytesOnDisk is the size of the log segments the partition keeps,
	// counting the records the node journal holds for them that they have
	// not written yet.
	BytesOnDisk int64
}

type cmdKind uint8

const (
	cmdPublish cmdKind = iota + 1
	cmdSettle
	cmdPurge // answered through published, with the count as the offset
	cmdDiscard
)

// command is one inbox entry.
type command struct {
	kind cmdKind
	// publish
	msg       queue.Message // times only; the payload is pre-encoded
	payload   []byte
	framed    []byte // payload behind its record type byte
	published func(offset uint64, duplicate bool, err error)
	prev      uint64 // the producer sequence this publish must follow; 0: none
	// settle
	op          SettleOp
	offset      uint64
	leaseID     uint64
	notBeforeMs int64 // Nack: not before; Extend: the extension in ms
	settled     func(error)
	by          Consumer // the consumer settling, if known (SettleFor)
}

type ctlKind uint8

const (
	ctlAttach ctlKind = iota + 1
	ctlDetach
	ctlDetachKeep // detach, the leases kept for keepMs (DetachKeeping)
	ctlDeadLettered
	ctlSetConfig
	ctlClaim
	ctlAdopt
	ctlInspect // run fn on the actor goroutine between turns (Peek, tests)
	ctlSteer   // move the gate to gate.Cohort/gate.Member once nothing is inflight
)

// control is a message that must not be refused for lack of inbox room.
type control struct {
	kind   ctlKind
	c      Consumer
	offset uint64
	err    error
	cfg    queue.Config
	fn     func()
	// ctlClaim
	owner   string
	claimed func([]queue.Info)
	// ctlAdopt
	adopted func(int)
	// ctlDetachKeep
	keepMs int64
	// ctlSteer
	gate queue.Gate
}

// Partition is the actor that owns one queue partition.
//
// Ownership: the goroutine started by Open (run) owns st, log appends,
// consumers, the body cache and the dead-letter bookkeeping. Other
// goroutines talk to it through the inbox (publish, settle), the control
// list (attach, detach, dead-letter confirmations, config changes) and the
// wake channel. Lock order: sendMu before ctlMu; neither is held while
// calling out.
type Partition struct {
	// decider is the deterministic half of the actor (decider.go): the
	// queue state, the dedup table, consumers, leases and the open stage.
	decider
	cfg    Config
	log    *seglog.Log
	logger *slog.Logger
	parked error // non-nil: quarantined, no goroutine runs
	// snap is the raft snapshot being built off the actor, or built and
	// not yet taken by raft (snapshot.go); actor only.
	snap *snapBuild
	// snapsSent holds, by follower, when this leader sent it a snapshot
	// that raft still waits on (snapshot.go); actor only.
	snapsSent map[uint64]int64
	// down is set (once) when the actor fails, for Unavailable.
	down    atomic.Pointer[error]
	qcfg    atomic.Pointer[queue.Config]
	stats   atomic.Pointer[Stats]
	ckptLSN uint64 // LSN covered by the last checkpoint (0: none)

	sendMu sync.RWMutex
	closed bool
	inbox  *inbox

	ctlMu sync.Mutex
	ctl   []control

	wake    chan struct{}
	stop    chan struct{}
	stopped chan struct{}

	// Actor-owned.
	failed      error
	sinceCkpt   int
	cache       *bodyCache
	deadLetters map[uint64]*deadLetter
	dlInflight  int
	missing     []uint64          // readAhead's scratch
	loaded      map[uint64][]byte // payloads readAhead found, for one deliver call
	// The pipeline (see doc.go): the decider's open stage collects what
	// the current turns produce; syncing waits for the sync under way
	// (syncBusy). syncReq
	// and synced connect the actor with its syncer goroutine; each holds
	// at most one message, since at most one sync is outstanding.
	syncing  stage
	syncBusy bool
	// spare is a released stage kept for its slices' capacity.
	spare stage
	// walDurable is the last index a WAL commit made durable (actor).
	walDurable uint64
	// raftDriver is the partition's raft node (raft.go).
	raftDriver
	syncReq chan struct{}
	synced  chan syncResult
	// syncerUp is set while a syncer goroutine runs (startSync starts
	// one, stopSyncer ends it once the partition is idle); syncerDone is
	// closed when the last one started has ended.
	syncerUp   bool
	syncerDone chan struct{}
	// ckptFailures counts failed checkpoints since Open, ckptStreak the
	// consecutive ones; no checkpoint is tried before ckptRetryAtMs.
	ckptFailures  uint64
	ckptStreak    int
	ckptRetryAtMs int64
	// ckptHold: a replicated leader's checkpoint is due and waits for its
	// entries to be committed; the actor takes no command meanwhile.
	ckptHold bool
	// ckptBusy: a checkpoint is with its checkpointer goroutine
	// (startCheckpoint), which answers on ckptDone; at most one is under
	// way.
	ckptBusy bool
	ckptDone chan ckptResult
	// idleShrunkMs is the lastBusyMs of the quiet spell in which the
	// partition last gave back memory (shrinkIdle), so it does so once
	// per spell.
	idleShrunkMs int64
	// lastBusyMs is when the actor last took a command or appended a
	// record (see idleCheckpointMs).
	lastBusyMs int64
	// relocs is relocate's scratch; relocated counts its copies.
	relocs    []queue.BodyLoc
	relocated uint64
}

// purgeJob is one Purge being carried out over one or more turns.
type purgeJob struct {
	below uint64 // NextLSN when the purge was taken: later messages stay
	n     uint64 // messages purged so far
	done  func(uint64, bool, error)
}

// stage is the output of one or more turns whose records one sync makes
// durable: its replies, deliveries and new dead letters are released only
// after that sync returns, and stages are released in order.
type stage struct {
	records int // log records decided by the stage's turns
	// entries counts the raft entries appended to the log during the
	// stage (the records above, and a follower's entries from its
	// leader): the stage needs a sync when there are any. last is the
	// log's last index when the stage was closed: it is released once
	// raft has committed that index. resps are the responses of the
	// stage's storage appends, delivered once its sync is done.
	entries int
	last    uint64
	// wal holds the stage's entries for Config.WAL (nil without one), and
	// hs a term or vote change to commit with them.
	wal        []wal.Entry
	hs         *wal.HardState
	resps      []*raftpb.Message
	replies    []reply
	deliveries []pending
	ended      []pending // leases that ended, told to their holders after deliveries
	newDead    []uint64
	// gates are the gate's moves and positions to tell watchers once
	// the stage is durable (see GateWatcher).
	gates []gateNote
	// carried is prefetch credit freed by settles in this stage (see
	// CreditCarrier) and not yet spent on its leases; it goes back to
	// its consumers after the stage's replies.
	carried []carry
}

// idle reports whether st holds nothing to release: no answer, delivery,
// lease end, dead letter or credit. Such a stage need not wait in line.
func (st *stage) idle() bool {
	return len(st.replies) == 0 && len(st.deliveries) == 0 && len(st.ended) == 0 &&
		len(st.newDead) == 0 && len(st.carried) == 0 && len(st.gates) == 0
}

// gateNote tells c (nil: every attached consumer) that the gate is at g.
type gateNote struct {
	c Consumer
	g queue.Gate
}

// carry is credit a consumer's settles in a stage freed for that stage's
// dispatch.
type carry struct {
	c Consumer
	n int
}

// reply is one command's answer. lsn is the last record appended when the
// answer was decided: it may be given only once every record up to lsn is
// durable, even when it is an error or an idempotent success that appended
// nothing itself (it may rest on a record still being synced).
type reply struct {
	published func(uint64, bool, error)
	settled   func(error)
	offset    uint64
	lsn       uint64
	err       error
	duplicate bool // a publish answered with an earlier store's offset
}

// syncResult is the syncer's answer: the LSN up to which records are as
// durable as the policy promises, and the error that stopped it, if any.
type syncResult struct {
	lsn uint64
	err error
}

type pending struct {
	c          Consumer
	offset     uint64
	leaseID    uint64
	attempt    uint32
	assignment uint64 // the gate's epoch when leased
}

// holder is the consumer a current lease was granted to.
type holder struct {
	c       Consumer
	leaseID uint64
}

type deadLetter struct {
	inflight  bool
	retryAtMs int64
}

func (c *Config) normalize() {
	if c.Counters == nil {
		c.Counters = new(Counters)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.InboxMax <= 0 {
		c.InboxMax = InboxMaxDefault
	}
	if c.CheckpointEveryRecords <= 0 {
		c.CheckpointEveryRecords = CheckpointEveryRecordsDefault
	}
	if c.BodyCacheBytes == 0 {
		c.BodyCacheBytes = BodyCacheBytesDefault
	}
	if c.PreferredOwnerHoldTicks <= 0 {
		c.PreferredOwnerHoldTicks = PreferredOwnerHoldTicksDefault
	}
}

// PreferredOwnerHoldTicksDefault is Config.PreferredOwnerHoldTicks's
// default: 30 s at the raft tick of `sinew serve --cluster` (50 ms).
const PreferredOwnerHoldTicksDefault = 600

// Open recovers the partition in cfg.Dir (checkpoint, then log replay) and
// starts its goroutine. Damage found on the way is returned wrapping
// ErrDamaged (and *seglog.CorruptionError when the log is at fault); the
// caller decides between Parked, failing, or reopening with
// seglog.CorruptionTruncate.
func Open(cfg Config) (*Partition, error) {
	cfg.normalize()
	p := newPartition(cfg)
	if err := p.recover(); err != nil {
		return nil, err
	}
	p.recoveredDueMs = p.nowMs() + max(cfg.RecoveredLeaseGraceMs, 0)
	// Recovery is not idleness: the records it replayed are checkpointed
	// once the partition has been idle for idleCheckpointMs after start,
	// not by its first turn (which would cost every partition a log sync
	// and a checkpoint write at each start).
	p.lastBusyMs = p.nowMs()
	p.publishStats()
	p.Poke() // the first turn acts on deadlines, recovered leases and dead letters found by recovery
	go p.run()
	return p, nil
}

// Parked returns a quarantined partition that serves nothing: every publish,
// settle and attach fails with ErrUnavailable. why is reported in Stats.
func Parked(cfg Config, why error) *Partition {
	cfg.normalize()
	p := newPartition(cfg)
	p.parked = why
	close(p.stopped)
	p.publishStats()
	return p
}

func newPartition(cfg Config) *Partition {
	p := &Partition{
		cfg:         cfg,
		logger:      cfg.Logger.With("topic", cfg.Topic, "group", cfg.Group, "partition", cfg.Index),
		inbox:       newInbox(cfg.InboxMax),
		wake:        make(chan struct{}, 1),
		synced:      make(chan syncResult, 1),
		ckptDone:    make(chan ckptResult, 1),
		stop:        make(chan struct{}),
		stopped:     make(chan struct{}),
		deadLetters: make(map[uint64]*deadLetter),
		loaded:      make(map[uint64][]byte),
		cache:       newBodyCache(cfg.BodyCacheBytes, cfg.BodyBudget),
	}
	p.decider = decider{
		counters: cfg.Counters,
		logger:   p.logger,
		graceMs:  cfg.RecoveredLeaseGraceMs,
		holders:  make(map[uint64]holder),
		acked:    newAckMemory(),
	}
	if p.cfg.LeaseIDs == nil {
		p.cfg.LeaseIDs = NewLeaseIDs()
	}
	q := cfg.Queue
	p.qcfg.Store(&q)
	return p
}

// NewLeaseIDs returns a source of lease ids for one partition: ChaCha8, a
// cryptographically strong generator, keyed from crypto/rand, so the ids
// cannot be predicted from the ones a client was given. Ids are below
// 2^63, so they stay positive wherever a client keeps them signed. The
// source is not safe for concurrent use: the partition's actor goroutine
// alone draws from it.
func NewLeaseIDs() func() uint64 {
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // never fails (crypto/rand.Read's doc)
	g := rand.NewChaCha8(seed)
	return func() uint64 { return g.Uint64() >> 1 }
}

func (p *Partition) logPath() string  { return filepath.Join(p.cfg.Dir, logDir) }
func (p *Partition) ckptPath() string { return filepath.Join(p.cfg.Dir, checkpointFile) }

func (p *Partition) nowMs() int64 { return p.cfg.Now().UnixMilli() }

func (p *Partition) publishStats() {
	s := &Stats{Consumers: len(p.consumers), CheckpointFailures: p.ckptFailures, Relocated: p.relocated,
		Duplicates: p.duplicates}
	switch {
	case p.parked != nil:
		s.Quarantined = true
		s.Err = p.parked.Error()
	case p.st != nil:
		s.Stats = p.st.Stats(p.nowMs())
		s.Gate = p.st.Gate()
		s.Dedup = p.dd.Stats()
		for _, seg := range p.log.Segments() {
			s.BytesOnDisk += seg.Bytes
		}
		// Records in the log's buffer are on disk in the node journal.
		s.BytesOnDisk += p.log.Buffered()
		if p.failed != nil {
			s.Err = p.failed.Error()
		}
	}
	p.stats.Store(s)
}

func (p *Partition) String() string {
	return fmt.Sprintf("%s/%s/p%d", p.cfg.Topic, p.cfg.Group, p.cfg.Index)
}

const (
	// ackRun consecutive offsets share a home run of slots.
	ackRun      = 8
	ackSlotsMin = 64
)
