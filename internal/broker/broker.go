package broker

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/dedup"
	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/internal/wal"
	"github.com/sinewmq/sinew/protocol"
)

// queuesDir is where queues live under DataDir.
const queuesDir = "queues"

// Errors callers may test for with errors.Is (they match on the code).
var (
	// ErrShuttingDown: the broker is closing or closed.
	ErrShuttingDown = &protocol.Error{Code: protocol.CodeShuttingDown, Message: "broker is shutting down"}
	// ErrStarting: the broker has not finished recovery.
	ErrStarting = &protocol.Error{Code: protocol.CodeUnavailable, Message: "broker is recovering"}
)

// Broker is the registry of queues and subscriptions.
//
// Locks, in the order they may be taken: createMu (queue creation and
// declaration changes; held across their file-system work and, in a
// cluster, the controller's commit), mu (the queue map; held briefly),
// subsMu (the subscription registry). dl.mu (deadletter.go) is a leaf,
// held only for a non-blocking send. Partition callbacks never take
// createMu: the dead-letter callback hands its copy to the dead-letter
// worker, which creates a missing target queue off the partition goroutine.
type Broker struct {
	cfg    Config
	logger *slog.Logger
	users  *auth.Users
	// owner prefixes lease owners so that a subscription id reused after a
	// restart never names the leases of its predecessor.
	owner string
	// budgets are the node-wide cache budgets (budgets.go).
	budgets nodeBudgets

	createMu sync.Mutex
	mu       sync.RWMutex
	queues   map[queueKey]*queueEntry
	// deleting holds the queues a Delete is removing (guarded by
	// createMu): they cannot be created again until their files are gone.
	deleting map[queueKey]chan struct{}
	// deletes counts Deletes under way, which Close waits for.
	deletes sync.WaitGroup

	subsMu  sync.Mutex
	subs    map[uint64]*Subscription
	nextSub atomic.Uint64

	ready  atomic.Bool
	closed atomic.Bool
	// leaving is set once a cluster node's planned stop begins
	// (HandOverForStop): its replicas take no lead from then on.
	leaving atomic.Bool
	// lock is DataDir's exclusive lock, held from Open to Close.
	lock *DataDirLock
	// wal is the node journal (DataDir/wal), which every partition on the
	// node commits through. walParts
	// maps its group names to partitions, for pressure calls: a nil value
	// is a partition still opening, or one quarantined (its WAL entries
	// are kept until it is repaired). A group not in walParts after
	// recovery belongs to a deleted queue.
	wal      *wal.WAL
	walMu    sync.Mutex
	walParts map[string]*partition.Partition
	// walStuck holds what the journal replayed for each quarantined
	// partition: its only copy of records the partition's own files may
	// lack. Under pressure it is committed again at the journal's head
	// (wal.Batch.Reset), so the partition keeps it without pinning the
	// journal's oldest segments, which go oldest first.
	walStuck map[string]*wal.Group
	// counters is shared by every partition (inspect.go).
	counters *partition.Counters
	// dl creates dead-letter queues and publishes dead-letter copies for
	// every partition of this node, off their goroutines (deadletter.go).
	dl *deadLetterWorker
	// testCreateHook, when set (by tests), runs before a dead-letter queue
	// is created.
	testCreateHook func(topic string)
	// cohorts plans and steers the cohorts' partitions (cohorts.go).
	cohorts cohorts
	// load samples the node's load for its cluster peers (load.go).
	load loadSampler
	// stir is signalled when a quiet group of this node wakes
	// (PlacementStirred).
	stir chan struct{}
}

type queueKey struct{ topic, group string }

// queueEntry is one queue: immutable after creation except meta, which
// Declare replaces under createMu.
type queueEntry struct {
	key   queueKey
	dir   string
	meta  atomic.Pointer[queueMeta]
	parts []*partition.Partition
	// walGroups names the partitions' node WAL groups (nil without one).
	walGroups []string
	rr        atomic.Uint64
	hintRR    atomic.Uint64 // the round-robin counter of partition hints (load.go)
	// deleted is set when Delete takes the queue out of the map.
	deleted atomic.Bool
	// self is this node's raft id in a cluster (0 on a single node).
	self uint64
	// unknownLogged is set once SyncCatalogue logged that the catalogue
	// never placed this queue's groups.
	unknownLogged atomic.Bool
	// purges is what this node did of the catalogue's purges, by
	// partition (cluster.go, carryPurges).
	purgeMu sync.Mutex
	purges  map[int]purgeMemo
}

func (c *Config) normalize() {
	if c.FS == nil {
		c.FS = vfs.OS()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.QueuesMax <= 0 {
		c.QueuesMax = QueuesMaxDefault
	}
	if c.QueuePartitionsMax <= 0 {
		c.QueuePartitionsMax = QueuePartitionsMaxDefault
	}
	c.QueuePartitionsMax = min(c.QueuePartitionsMax, PartitionsMax)
	if c.PartitionsTotalMax <= 0 {
		c.PartitionsTotalMax = PartitionsTotalMaxDefault
	}
	if c.DefaultPartitions <= 0 {
		c.DefaultPartitions = DefaultPartitionsDefault
	}
	c.DefaultPartitions = min(c.DefaultPartitions, c.QueuePartitionsMax)
	if c.DefaultLeaseMs <= 0 {
		c.DefaultLeaseMs = DefaultLeaseMsDefault
	}
	if c.DefaultMaxRetries == 0 {
		c.DefaultMaxRetries = DefaultMaxRetriesDefault
	}
	c.DefaultMaxRetries = max(c.DefaultMaxRetries, 0)
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = DeadLetterTopicDefault
	}
	if c.InboxMax <= 0 {
		c.InboxMax = InboxMaxDefault
	}
	if c.BodyBytesMax <= 0 {
		c.BodyBytesMax = BodyBytesMaxDefault
	}
	if c.PrefetchMax <= 0 {
		c.PrefetchMax = PrefetchMaxDefault
	}
	if c.CheckpointEveryRecords <= 0 {
		c.CheckpointEveryRecords = CheckpointEveryRecordsDefault
	}
	c.DelayMsMax = normalizeCap(c.DelayMsMax, DelayMsMaxDefault)
	c.TTLMsMax = normalizeCap(c.TTLMsMax, TTLMsMaxDefault)
	c.NackDelayMsMax = normalizeCap(c.NackDelayMsMax, NackDelayMsMaxDefault)
}

// Open recovers every queue and partition under cfg.DataDir and starts
// serving. Damaged partitions are handled by cfg.Quarantine.
func Open(cfg Config) (b *Broker, err error) {
	lock := cfg.Lock
	cfg.Lock = nil
	defer func() {
		if err != nil {
			lock.Release()
		}
	}()
	cfg.normalize()
	if cfg.DataDir == "" {
		return nil, errors.New("broker: DataDir is required")
	}
	if err := validName("dead-letter topic", cfg.DeadLetterTopic, false); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	if lock == nil {
		if lock, err = LockDataDir(cfg.FS, cfg.DataDir); err != nil {
			return nil, fmt.Errorf("broker: %w", err)
		}
	} else if filepath.Clean(lock.dir) != filepath.Clean(cfg.DataDir) {
		return nil, fmt.Errorf("broker: Config.Lock is for %s, not DataDir %s", lock.dir, cfg.DataDir)
	}
	b = &Broker{
		cfg:      cfg,
		lock:     lock,
		logger:   cfg.Logger,
		owner:    "b" + strconv.FormatInt(cfg.Now().UnixNano(), 36),
		queues:   make(map[queueKey]*queueEntry),
		deleting: make(map[queueKey]chan struct{}),
		subs:     make(map[uint64]*Subscription),
		counters: new(partition.Counters),
		stir:     make(chan struct{}, 1),
		budgets:  newNodeBudgets(&cfg),
	}
	if b.users = cfg.Users; b.users == nil {
		params := cfg.UserHashParams
		if params == (auth.HashParams{}) {
			params = auth.DefaultHashParams
		}
		if b.users, err = auth.OpenUsersParams(cfg.FS, UsersPath(cfg.DataDir), params); err != nil {
			return nil, fmt.Errorf("broker: %w", err)
		}
	}
	b.dl = newDeadLetterWorker(cmp.Or(cfg.deadLetterJobsMax, deadLetterJobsMax))
	root := filepath.Join(cfg.DataDir, queuesDir)
	if err := cfg.FS.MkdirAll(root, vfs.DirPerm); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	if err := syncDirs(cfg.FS, root, cfg.DataDir); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	b.walParts = map[string]*partition.Partition{}
	b.walStuck = map[string]*wal.Group{}
	wopts := wal.Options{FS: cfg.FS, Dir: filepath.Join(cfg.DataDir, "wal"), SegmentBytes: cfg.walSegmentBytes, OnPressure: b.walPressure}
	if cfg.Sync == seglog.SyncInterval {
		// storage.sync = interval: confirm once written to the OS, the
		// journal fsyncs every SyncIntervalMs.
		wopts.SyncIntervalMs = cfg.SyncIntervalMs
		if wopts.SyncIntervalMs <= 0 {
			wopts.SyncIntervalMs = seglog.SyncIntervalMsDefault
		}
	}
	b.wal, err = wal.Open(wopts)
	if err != nil {
		return nil, fmt.Errorf("broker: node journal: %w", err)
	}
	if err := b.recover(root); err != nil {
		b.closePartitions()
		if b.wal != nil {
			b.wal.Close()
		}
		return nil, err
	}
	if b.wal != nil {
		// Groups no queue claimed belong to deleted queues.
		for _, g := range b.wal.Replayed() {
			b.wal.Forget(g)
		}
	}
	b.dl.start(b)
	b.cohorts.init()
	go b.runCohorts()
	b.ready.Store(true)
	for _, q := range b.queues {
		for _, p := range q.parts {
			p.Poke() // dead-letter copies deferred during recovery
		}
	}
	return b, nil
}

// walPressure is the WAL's OnPressure: the partition named group syncs its
// own log and releases the WAL, so an idle partition does not keep old WAL
// segments.
//
// Only a group that no queue can claim is forgotten here: one unknown
// after recovery. During recovery an unknown group may belong to a queue
// not opened yet, whose partition releases the WAL itself once it has
// merged its entries; a partition opening or quarantined (nil in
// walParts) keeps its entries; a deleted queue's groups are forgotten by
// Delete once its files are durably gone; a closed partition's are kept
// for the next start.
func (b *Broker) walPressure(group string, _ uint64) {
	b.walMu.Lock()
	p, known := b.walParts[group]
	b.walMu.Unlock()
	switch {
	case !known:
		if b.ready.Load() {
			b.wal.Forget(group)
		}
		return
	case p == nil:
		b.walMu.Lock()
		g := b.walStuck[group]
		b.walMu.Unlock()
		if g != nil {
			b.walCarry(group, g)
		}
		return
	}
	if err := p.ReleaseWAL(); err != nil && !errors.Is(err, seglog.ErrClosed) {
		b.logger.Warn("partition could not release the node WAL", "group", group, "err", err)
	}
}

// walCarry commits a quarantined partition's replayed records again at the
// journal's head, voiding their older copies.
func (b *Broker) walCarry(group string, g *wal.Group) {
	batch := wal.Batch{Reset: true, Entries: g.Entries}
	if g.HasHardState {
		hs := g.HardState
		batch.HardState = &hs
	}
	if err := b.wal.Commit(group, batch); err != nil && !errors.Is(err, wal.ErrClosed) {
		b.logger.Warn("could not carry a quarantined partition's journal records forward", "group", group, "err", err)
	}
}

// walGroup names the journal group of partition idx of the queue in dir
// (relative to the data directory). A queue deleted and created again under
// the same name never shares a group with its predecessor: a single-node
// queue carries an incarnation in its metadata, and a replicated partition
// is named by its raft group, which the controller never reuses.
func (b *Broker) walGroup(dir string, m *queueMeta, idx uint32) (string, error) {
	group, err := filepath.Rel(b.cfg.DataDir, dir)
	if err != nil {
		return "", fmt.Errorf("broker: %w", err)
	}
	group = filepath.ToSlash(group)
	if m.Incarnation != "" {
		group += "@" + m.Incarnation
	}
	if int(idx) < len(m.Raft) && m.Raft[idx].RaftGroup != 0 {
		group += "@g" + strconv.FormatUint(m.Raft[idx].RaftGroup, 10)
	}
	return group, nil
}

// UsersPath is where the users store of the broker at dataDir lives.
func UsersPath(dataDir string) string { return filepath.Join(dataDir, "meta", "users") }

// Users returns the broker's users store, for the wire server (HELLO
// authentication) and the admin API. It is safe for concurrent use and
// stays usable after Close (it holds no open files).
func (b *Broker) Users() *auth.Users { return b.users }

func syncDirs(fsys vfs.FS, dirs ...string) error {
	for _, d := range dirs {
		if err := fsys.SyncDir(d); err != nil {
			return err
		}
	}
	return nil
}

// recover loads every queue found under root.
func (b *Broker) recover(root string) error {
	topics, err := b.cfg.FS.ReadDir(root)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	var found []foundQueue
	for _, t := range topics {
		if t == trashDir {
			// Deletions interrupted by a crash: the queues were renamed
			// here durably, so they are gone; finish removing them.
			b.emptyTrash(filepath.Join(root, t))
			continue
		}
		if !isQueueDirName(t) {
			b.logger.Warn("ignoring unknown entry in the queues directory", "name", t)
			continue
		}
		groups, err := b.cfg.FS.ReadDir(filepath.Join(root, t))
		if err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		for _, g := range groups {
			dir := filepath.Join(root, t, g)
			if !isQueueDirName(g) {
				b.logger.Warn("ignoring unknown entry in a topic directory", "dir", dir)
				continue
			}
			m, err := readMeta(b.cfg.FS, filepath.Join(dir, metaFile))
			if isNotExist(err) {
				// Creation was interrupted before the definition was
				// durable: nothing was ever published to it.
				b.logger.Warn("ignoring queue directory without metadata", "dir", dir)
				continue
			}
			if err != nil {
				return fmt.Errorf("broker: queue metadata: %w", err)
			}
			if dirName(m.Topic) != t || dirName(m.Group) != g {
				return fmt.Errorf("broker: %s holds metadata of queue %q/%q", dir, m.Topic, m.Group)
			}
			found = append(found, foundQueue{dir, m})
		}
	}
	// One syncfs makes what the last process left durable (a crash's
	// unsynced writes and directories), instead of a sync of each
	// partition's directories and files as it opens: thousands of syncs
	// that each wait on the disk. Without it, each partition syncs its own.
	synced, err := vfs.SyncAll(b.cfg.FS, root)
	if err != nil {
		return fmt.Errorf("broker: sync the data directory's file system: %w", err)
	}
	// The queues open recoverQueuesParallel at a time (each opens its
	// partitions openParallelMax at a time): a restart waits on files
	// and the journal, not on one partition after another.
	qs, err := openBounded(len(found), recoverQueuesParallel, func(i int) (*queueEntry, error) {
		return b.openQueue(found[i].dir, found[i].m, synced)
	})
	if err != nil {
		for _, q := range qs {
			if q != nil {
				for _, p := range q.parts {
					p.Close()
				}
			}
		}
		return err
	}
	for _, q := range qs {
		b.queues[q.key] = q
	}
	return nil
}

// recoverQueuesParallel bounds the queues recover opens at once.
const recoverQueuesParallel = 4

// foundQueue is a queue recover found on disk.
type foundQueue struct {
	dir string
	m   *queueMeta
}

// openQueue opens (or creates) every partition of the queue described by m.
// survivorsDurable says the node synced its file system since the last
// process wrote the queue (partition.Config.SurvivorsDurable).
func (b *Broker) openQueue(dir string, m *queueMeta, survivorsDurable bool) (*queueEntry, error) {
	q := &queueEntry{key: queueKey{m.Topic, m.Group}, dir: dir}
	if b.cfg.Cluster != nil {
		q.self = b.cfg.Cluster.Self()
	}
	q.meta.Store(m)
	qc := b.queueConfig(m)
	b.logKeep(m)
	// Three passes: each partition's configuration, in order; the opens,
	// up to openParallelMax at once (a restart of a node of thousands of
	// partitions is bounded by them: each reads its files and commits to
	// the journal, whose group commit then shares the fsyncs among them);
	// and the queue's partitions, in order.
	pcs := make([]partition.Config, m.Partitions)
	groups := make([]uint64, m.Partitions)
	for i := range m.Partitions {
		pc := partition.Config{
			Topic: m.Topic, Group: m.Group, Index: i,
			Dir: filepath.Join(dir, "p"+strconv.FormatUint(uint64(i), 10)),
			FS:  b.cfg.FS, Now: b.cfg.Now, Logger: b.logger, Queue: qc,
			Sync: b.cfg.Sync, SyncIntervalMs: b.cfg.SyncIntervalMs, SegmentBytes: b.cfg.SegmentBytes,
			Preallocate: b.cfg.Preallocate,
			InboxMax:    b.cfg.InboxMax, CheckpointEveryRecords: b.cfg.CheckpointEveryRecords,
			BodyCacheBytes:        b.cfg.BodyCacheBytes,
			Dedup:                 b.cfg.Dedup,
			RecoveredLeaseGraceMs: b.cfg.RecoveredLeaseGraceMs,
			SurvivorsDurable:      survivorsDurable,
			DeadLetter:            b.deadLetter,
			Counters:              b.counters, OnSync: b.cfg.OnSync,
			OnStir: b.stirPlacement,
		}
		pc.BodyBudget, pc.RaftBudget = b.budgets.body, b.budgets.raft
		if b.wal != nil {
			group, gerr := b.walGroup(pc.Dir, m, i)
			if gerr != nil {
				return nil, gerr
			}
			pc.WAL, pc.WALGroup = b.wal, group
			q.walGroups = append(q.walGroups, group)
			// Known (nil: opening) before its entries leave the WAL's
			// replay set, so that pressure never forgets them.
			b.walMu.Lock()
			b.walParts[group] = nil
			b.walMu.Unlock()
			if g, ok := b.wal.Take(pc.WALGroup); ok {
				pc.WALReplay = &g
			}
		}
		var raftGroup uint64
		if b.cfg.Cluster != nil && len(m.Raft) == int(m.Partitions) {
			raftGroup = m.Raft[i].RaftGroup
			pc.RaftID, pc.RaftPeers = b.cfg.Cluster.Self(), m.Raft[i].Replicas
			pc.Send = b.cfg.Cluster.Sender(raftGroup)
			pc.Replicated = true // a queue of one replica may grow
			pc.PeerAlive = b.cfg.Cluster.PeerAlive
			pc.Fenced = b.cfg.Cluster.Fenced
			// A replica placed after the group started (the recovery plan)
			// starts from the group's first configuration, as the others
			// did, and waits to be added: it is not a voter there.
			joins := len(m.Raft[i].Bootstrap) > 0 && !slices.Contains(m.Raft[i].Bootstrap, pc.RaftID)
			if len(m.Raft[i].Bootstrap) > 0 {
				pc.RaftPeers = m.Raft[i].Bootstrap
			}
			pc.CampaignAtStart = !joins && len(m.Raft[i].Replicas) > 0 && m.Raft[i].Replicas[0] == pc.RaftID && !b.leaving.Load()
		}
		pcs[i], groups[i] = pc, raftGroup
	}
	parts, err := openBounded(len(pcs), openParallelMax, func(i int) (*partition.Partition, error) {
		return b.openPartition(pcs[i], groups[i])
	})
	if err != nil {
		for _, p := range parts {
			if p != nil {
				p.Close()
			}
		}
		return nil, fmt.Errorf("broker: %w", err)
	}
	q.parts = parts
	return q, nil
}

// openBounded runs open(i) for i in [0, n), at most limit at once, and
// returns the results in order with every error joined; on an error the
// caller closes what did open (the non-nil results).
func openBounded[T any](n, limit int, open func(i int) (T, error)) ([]T, error) {
	out := make([]T, n)
	errs := make([]error, n)
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = open(i)
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// openParallelMax bounds the partitions of one queue opened at once.
const openParallelMax = 16

// openPartition opens one partition of a queue (openQueue), applies the
// quarantine policy to a damaged one, and registers it with the raft host
// (raftGroup, 0 for none) and the journal. Safe to run beside the opens of
// the queue's other partitions.
func (b *Broker) openPartition(pc partition.Config, raftGroup uint64) (*partition.Partition, error) {
	p, err := partition.Open(pc)
	if err != nil && errors.Is(err, partition.ErrDamaged) {
		p, err = b.damaged(pc, err)
	}
	if err != nil {
		return nil, err
	}
	if raftGroup != 0 {
		if err := b.cfg.Cluster.AddGroup(raftGroup, p); err != nil {
			p.Close()
			return nil, err
		}
	}
	if b.wal != nil {
		b.walMu.Lock()
		if p.Quarantined() == nil {
			b.walParts[pc.WALGroup] = p
		} else if pc.WALReplay != nil && len(pc.WALReplay.Entries) > 0 {
			b.walStuck[pc.WALGroup] = pc.WALReplay
		}
		b.walMu.Unlock()
	}
	return p, nil
}

// damaged applies the quarantine policy to a partition that failed
// verification.
func (b *Broker) damaged(pc partition.Config, err error) (*partition.Partition, error) {
	switch b.cfg.Quarantine {
	case Refuse:
		return nil, err
	case Ignore:
		b.logger.Error("DAMAGED PARTITION: reopening cut at the first bad record; confirmed messages after it are LOST",
			"topic", pc.Topic, "group", pc.Group, "partition", pc.Index, "err", err)
		pc.Corruption = seglog.CorruptionTruncate
		p, err2 := partition.Open(pc)
		if err2 == nil {
			return p, nil
		}
		if !errors.Is(err2, partition.ErrDamaged) {
			return nil, err2
		}
		err = err2
	}
	b.logger.Error("DAMAGED PARTITION QUARANTINED: it is not served until repaired",
		"topic", pc.Topic, "group", pc.Group, "partition", pc.Index, "dir", pc.Dir, "err", err)
	return partition.Parked(pc, err), nil
}

// queueConfig resolves a queue's settings into the partition's queue
// configuration.
func (b *Broker) queueConfig(m *queueMeta) queue.Config {
	qc := queue.Config{MaxRetries: m.MaxRetries, LeaseMs: m.LeaseMs, DefaultTTLMs: m.DefaultTTLMs}
	if m.MaxRetries == 0 {
		qc.MaxRetries = queue.NoRetries
	}
	if b.keepReason(m) != "" {
		return keepConfig(qc) // see deadletter.go
	}
	qc.DeadLetter.Target = b.deadLetterTarget(m)
	return qc
}

// deadLetterTarget resolves where a queue's dead messages go: a topic (its
// default group), or "" to discard. A queue never dead-letters into itself:
// such queues keep their messages instead (queueConfig).
func (b *Broker) deadLetterTarget(m *queueMeta) string {
	var t string
	switch m.DeadLetterMode {
	case protocol.DeadLetterDiscard:
		return ""
	case protocol.DeadLetterQueue:
		t = m.DeadLetterTarget
	default:
		t = b.cfg.DeadLetterTopic
	}
	if m.Group == "" && m.Topic == t || m.Topic == b.cfg.DeadLetterTopic && t == b.cfg.DeadLetterTopic {
		return ""
	}
	return t
}

// CreateCheck decides whether a request may create the queue (topic,
// group) it names when that queue does not exist (creation on first use):
// nil lets it, an error is the request's answer. The broker asks it under
// the lock that serialises creation, after finding the queue missing here
// and, in a cluster, in the catalogue, so a request to a queue that exists
// never asks and a check cannot be split from the creation it allows. It
// must not block or call back into the broker.
type CreateCheck func(topic, group string) error

// lookup finds a queue; a missing one is CodeNotFound.
func (b *Broker) lookup(topic, group string) (*queueEntry, error) {
	b.mu.RLock()
	q := b.queues[queueKey{topic, group}]
	b.mu.RUnlock()
	if q == nil {
		return nil, protocol.Errorf(protocol.CodeNotFound, "no queue %q group %q", topic, group)
	}
	return q, nil
}

// lookupOrCreate finds a queue, creating it with the broker's defaults when
// it is missing and mayCreate (nil: always) allows.
func (b *Broker) lookupOrCreate(topic, group string, mayCreate CreateCheck) (*queueEntry, error) {
	b.mu.RLock()
	q := b.queues[queueKey{topic, group}]
	b.mu.RUnlock()
	if q != nil {
		return q, nil
	}
	q, _, err := b.declareQueue(&protocol.DeclareQueue{Topic: topic, Group: group, MaxRetries: -1}, false, false, mayCreate)
	return q, err
}

// Close stops the broker: subscriptions are told (SubClosedShutdown), every
// partition stops, writes a final checkpoint and closes its log. Leases
// outstanding at Close stay in the log; after a restart they are released
// once Config.RecoveredLeaseGraceMs has passed (at once by default).
func (b *Broker) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.ready.Store(false)
	b.stopCohorts()
	b.subsMu.Lock()
	subs := make([]*Subscription, 0, len(b.subs))
	for _, s := range b.subs {
		subs = append(subs, s)
	}
	b.subsMu.Unlock()
	for _, s := range subs {
		s.end(protocol.SubClosedShutdown, ErrShuttingDown, false)
	}
	// The dead-letter worker may be creating a queue; it finishes that
	// job and answers the rest ErrShuttingDown, so that no partition waits
	// for a copy that will never be confirmed.
	b.dl.stop()
	// Wait out a creation under way; later ones see closed and refuse.
	b.createMu.Lock()
	b.createMu.Unlock()
	b.deletes.Wait()
	err := b.closePartitions()
	if b.wal != nil {
		// Every partition that closed cleanly has released its entries;
		// then the journal's segments are deleted, and the next start
		// begins a fresh one.
		retired, werr := b.wal.Retire()
		err = errors.Join(err, werr)
		if werr == nil && !retired {
			b.logger.Info("node journal kept: some partitions' records are only there (a quarantined or failed partition); the next start replays it")
		}
	}
	// Released only once every partition has closed its files.
	return errors.Join(err, b.lock.Release())
}

func (b *Broker) closePartitions() error {
	b.mu.RLock()
	var parts []*partition.Partition
	for _, q := range b.queues {
		parts = append(parts, q.parts...)
		if b.cfg.Cluster != nil {
			for _, r := range q.meta.Load().Raft {
				b.cfg.Cluster.RemoveGroup(r.RaftGroup)
			}
		}
	}
	b.mu.RUnlock()
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Go(func() { errs[i] = p.Close() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Declare creates a queue or checks an existing one. Re-declaring with a
// different partition count is CodeConflict; retries, TTL, lease and
// dead-letter settings are updated (durably) to what the declaration says.
func (b *Broker) Declare(ctx context.Context, d *protocol.DeclareQueue) (protocol.DeclareOK, error) {
	if err := ctx.Err(); err != nil {
		return protocol.DeclareOK{}, err
	}
	if ok, handled, err := b.declareElsewhere(d); handled {
		return ok, err
	}
	q, created, err := b.declare(d, true)
	if pe := (*placedElsewhere)(nil); errors.As(err, &pe) {
		// Committed to the catalogue and placed on other nodes: the
		// declaration is done. Another node's proposal may have come
		// first; the declaration is then checked against it (and its
		// settings updated) as for any queue held elsewhere.
		ok, handled, err := b.declareElsewhere(d)
		if !handled {
			return protocol.DeclareOK{}, errDeletedMeanwhile(queueKey{d.Topic, d.Group})
		}
		ok.Created = err == nil && pe.mine
		return ok, err
	}
	if err != nil {
		return protocol.DeclareOK{}, err
	}
	return protocol.DeclareOK{Partitions: q.meta.Load().Partitions, Created: created}, nil
}

// declare implements Declare; with update false an existing queue is
// returned as is (first-use creation racing a declaration).
func (b *Broker) declare(d *protocol.DeclareQueue, update bool) (*queueEntry, bool, error) {
	return b.declareQueue(d, update, false, nil)
}

// declareQueue is declare; dlq marks a queue it creates as a dead-letter
// queue, which keeps every message (deadletter.go). mayCreate, when set, is
// asked before a queue that exists neither here nor in the cluster's
// catalogue is created (see CreateCheck).
func (b *Broker) declareQueue(d *protocol.DeclareQueue, update, dlq bool, mayCreate CreateCheck) (*queueEntry, bool, error) {
	if b.closed.Load() {
		return nil, false, ErrShuttingDown
	}
	want, err := b.metaFor(d)
	if err != nil {
		return nil, false, err
	}
	want.DeadLetterQueue = want.DeadLetterQueue || dlq
	b.createMu.Lock()
	defer b.createMu.Unlock()
	if b.closed.Load() {
		return nil, false, ErrShuttingDown
	}
	k := queueKey{d.Topic, d.Group}
	if b.deleting[k] != nil {
		return nil, false, protocol.Errorf(protocol.CodeUnavailable, "queue %q group %q is being deleted; retry", d.Topic, d.Group)
	}
	b.mu.RLock()
	q := b.queues[k]
	b.mu.RUnlock()
	if q != nil {
		if !update {
			return q, false, nil
		}
		cur := q.meta.Load()
		if d.Partitions != 0 && d.Partitions != cur.Partitions {
			return nil, false, protocol.Errorf(protocol.CodeConflict,
				"queue %q group %q has %d partitions, not %d", d.Topic, d.Group, cur.Partitions, d.Partitions)
		}
		want.Partitions = cur.Partitions
		want.Incarnation = cur.Incarnation
		// A dead-letter queue stays one whatever a declaration says.
		want.DeadLetterQueue = want.DeadLetterQueue || cur.DeadLetterQueue
		want.Raft = cur.Raft
		if sameMeta(want, cur) {
			return q, false, nil
		}
		if b.cfg.Cluster != nil {
			// The catalogue first; every other node applies the change
			// when it applies the entry (SyncCatalogue).
			ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
			found, err := b.cfg.Cluster.UpdateQueue(ctx, k.topic, k.group, settingsOf(want))
			cancel()
			switch {
			case err != nil:
				return nil, false, protocol.Errorf(protocol.CodeUnavailable, "queue %q group %q: the cluster did not commit the new settings: %v; retry", k.topic, k.group, err)
			case !found:
				return nil, false, errDeletedMeanwhile(k)
			}
		}
		if err := b.storeSettings(q, want); err != nil {
			return nil, false, b.internalError("declare", k, err)
		}
		return q, false, nil
	}

	if mayCreate != nil && !b.inCatalogue(k) {
		// Before the budget: a request that may not create is told so,
		// not that the broker is full.
		if err := mayCreate(k.topic, k.group); err != nil {
			return nil, false, err
		}
	}
	if err := b.checkBudget(k, want); err != nil {
		return nil, false, err
	}
	if b.cfg.Cluster != nil {
		q, err := b.createInCluster(k, want)
		return q, err == nil, err
	}
	if b.wal != nil {
		inc, err := newIncarnation()
		if err != nil {
			return nil, false, b.internalError("create queue", k, err)
		}
		want.Incarnation = inc
	}
	root := filepath.Join(b.cfg.DataDir, queuesDir)
	tdir := filepath.Join(root, dirName(d.Topic))
	dir := filepath.Join(tdir, dirName(d.Group))
	if err := b.cfg.FS.MkdirAll(dir, vfs.DirPerm); err != nil {
		return nil, false, b.internalError("create queue", k, err)
	}
	if err := writeMeta(b.cfg.FS, filepath.Join(dir, metaFile), want); err != nil {
		return nil, false, b.internalError("create queue", k, err)
	}
	if err := syncDirs(b.cfg.FS, tdir, root); err != nil {
		return nil, false, b.internalError("create queue", k, err)
	}
	q, err = b.openQueue(dir, want, false)
	if err != nil {
		return nil, false, b.internalError("create queue", k, err)
	}
	b.mu.Lock()
	b.queues[k] = q
	b.mu.Unlock()
	return q, true, nil
}

// metaFor validates a declaration and resolves its defaults.
func (b *Broker) metaFor(d *protocol.DeclareQueue) (*queueMeta, error) {
	if err := validName("topic", d.Topic, false); err != nil {
		return nil, err
	}
	if err := validName("group", d.Group, true); err != nil {
		return nil, err
	}
	if err := b.refuseSelfDeadLetter(d); err != nil {
		return nil, err
	}
	m := &queueMeta{Version: metaVersion, Topic: d.Topic, Group: d.Group, Partitions: d.Partitions,
		LeaseMs: d.LeaseMs, MaxRetries: int(d.MaxRetries), DefaultTTLMs: d.DefaultTTLMs,
		DeadLetterMode:  d.DeadLetterMode,
		DeadLetterQueue: d.Group == "" && d.Topic == b.cfg.DeadLetterTopic}
	switch {
	case d.Partitions > uint32(b.cfg.QueuePartitionsMax):
		return nil, protocol.Errorf(protocol.CodeLimitExceeded, "%d partitions, more than limits.queue_partitions_max %d",
			d.Partitions, b.cfg.QueuePartitionsMax)
	case d.Partitions == 0:
		m.Partitions = uint32(b.cfg.DefaultPartitions)
	}
	switch {
	case d.LeaseMs < 0 || d.LeaseMs > queue.LeaseMsMax:
		return nil, protocol.Errorf(protocol.CodeBadRequest, "lease_ms %d out of range [0, %d]", d.LeaseMs, queue.LeaseMsMax)
	case d.LeaseMs == 0:
		m.LeaseMs = b.cfg.DefaultLeaseMs
	}
	switch {
	case d.MaxRetries < -1 || d.MaxRetries > queue.MaxRetriesMax:
		return nil, protocol.Errorf(protocol.CodeBadRequest, "max_retries %d out of range [-1, %d]", d.MaxRetries, queue.MaxRetriesMax)
	case d.MaxRetries == -1:
		m.MaxRetries = b.cfg.DefaultMaxRetries
	}
	if d.DefaultTTLMs < 0 {
		return nil, protocol.Errorf(protocol.CodeBadRequest, "default_ttl_ms %d is negative", d.DefaultTTLMs)
	}
	if err := b.checkDefaultTTL(d.DefaultTTLMs); err != nil {
		return nil, err
	}
	switch d.DeadLetterMode {
	case protocol.DeadLetterDefault, protocol.DeadLetterDiscard, protocol.DeadLetterGlobal:
		if d.DeadLetterTarget != "" {
			return nil, protocol.Errorf(protocol.CodeBadRequest, "dead_letter_target is set but the mode is %d", d.DeadLetterMode)
		}
	case protocol.DeadLetterQueue:
		if err := validName("dead_letter_target", d.DeadLetterTarget, false); err != nil {
			return nil, err
		}
		m.DeadLetterTarget = d.DeadLetterTarget
	default:
		return nil, protocol.Errorf(protocol.CodeBadRequest, "unknown dead_letter_mode %d", d.DeadLetterMode)
	}
	return m, nil
}

// pick chooses the partition for a publish: the requested one, the key's
// hash, the producer's hash, or round-robin over the partitions that are
// served, taking the next one instead when its backlog is smaller
// (lighter, load.go).
func (q *queueEntry) pick(want int32, key []byte, producer string, seq uint64) (*partition.Partition, error) {
	n := len(q.parts)
	switch {
	case want >= 0:
		if int(want) >= n {
			return nil, protocol.Errorf(protocol.CodeNotFound, "queue %q group %q has no partition %d", q.key.topic, q.key.group, want)
		}
		return q.parts[want], nil
	case len(key) > 0:
		return q.parts[keyPartition(key, n)], nil
	case producer != "":
		// A resend must reach the partition that remembers its first
		// store, so an idempotent keyless publish is placed by its
		// identity, not by the round-robin counter.
		return q.parts[producerPartition(producer, seq, n)], nil
	}
	start := q.rr.Add(1)
	for i := range n {
		p := q.parts[(start+uint64(i))%uint64(n)]
		if p.Quarantined() == nil && q.leadsHere(p) {
			return q.lighter(p, start+uint64(i)), nil
		}
	}
	for i := range n {
		p := q.parts[(start+uint64(i))%uint64(n)]
		if p.Quarantined() == nil {
			return p, nil // led elsewhere: answered not_owner
		}
	}
	return q.parts[start%uint64(n)], nil // every partition is parked: it answers unavailable
}

// keyPartition maps a key to a partition with 32-bit FNV-1a. It is part of
// the on-disk contract: the same key must find the same partition after a
// restart or an upgrade.
func keyPartition(key []byte, n int) int {
	h := fnv.New32a()
	h.Write(key)
	return int(h.Sum32() % uint32(n))
}

// producerPartition maps a producer id and sequence to a partition with
// 32-bit FNV-1a over the id and the sequence (8 bytes, little endian). Like
// keyPartition it is part of the on-disk contract: a resend after a restart
// or an upgrade must find the partition holding the original.
func producerPartition(producer string, seq uint64, n int) int {
	h := fnv.New32a()
	h.Write([]byte(producer))
	h.Write(binary.LittleEndian.AppendUint64(nil, seq))
	return int(h.Sum32() % uint32(n))
}

// Publish enqueues p asynchronously. done is called exactly once and must
// not block: from the partition goroutine after the record is durable, or
// with an error, which may happen before Publish returns (invalid input,
// full inbox, shutdown). Queues are created on first use. Keyed publishes
// hash to a stable partition; keyless ones with a producer id hash their
// (producer id, sequence); other keyless ones go round-robin. A publish with
// a producer id whose sequence the partition remembers is answered with the
// original partition and offset and Duplicate set, and stores nothing; one
// below the producer's window fails with sequence_too_old (see
// internal/dedup). One whose ProducerPrev the partition does not hold yet
// fails with out_of_sequence and stores nothing (docs/protocol.md, Ordered
// publish). The broker copies what it keeps; the caller may reuse p
// after Publish returns.
func (b *Broker) Publish(p *protocol.Publish, done func(protocol.PublishOK, error)) {
	b.PublishChecked(p, nil, done)
}

// PublishChecked is Publish where a queue that does not exist is created
// only when mayCreate allows (nil: always); otherwise done gets its error.
func (b *Broker) PublishChecked(p *protocol.Publish, mayCreate CreateCheck, done func(protocol.PublishOK, error)) {
	if b.closed.Load() {
		done(protocol.PublishOK{}, ErrShuttingDown)
		return
	}
	if err := b.checkPublish(p); err != nil {
		done(protocol.PublishOK{}, err)
		return
	}
	if b.fenced() {
		done(protocol.PublishOK{}, errFenced)
		return
	}
	if err := b.checkTimes(p, b.cfg.Now().UnixMilli()); err != nil {
		done(protocol.PublishOK{}, err) // caps.go
		return
	}
	q, err := b.lookupOrCreate(p.Topic, p.Group, mayCreate)
	if err != nil {
		done(protocol.PublishOK{}, err)
		return
	}
	part, err := q.pick(p.Partition, p.Key, p.ProducerID, p.ProducerSeq)
	if err != nil {
		done(protocol.PublishOK{}, err)
		return
	}
	now := b.cfg.Now().UnixMilli()
	m := queue.Message{Key: p.Key, ContentType: p.ContentType, NotBeforeMs: p.NotBeforeMs,
		PublishedAtMs: now, ProducerID: p.ProducerID, ProducerSeq: p.ProducerSeq, Body: p.Body}
	if m.NotBeforeMs == 0 && p.DelayMs > 0 {
		m.NotBeforeMs = now + p.DelayMs
	}
	if p.TTLMs > 0 {
		m.ExpiresAtMs = now + p.TTLMs
	}
	if len(p.Headers) > 0 {
		m.Headers = make([]queue.Header, len(p.Headers))
		for i, h := range p.Headers {
			m.Headers[i] = queue.Header(h)
		}
	}
	idx := part.Index()
	prev := p.ProducerPrev
	if prev != 0 && p.Partition < 0 && len(p.Key) == 0 &&
		producerPartition(p.ProducerID, prev, len(q.parts)) != int(idx) {
		// A keyless link whose predecessor the hash placed in another
		// partition: there is no order between partitions to keep.
		prev = 0
	}
	keyless := len(p.Key) == 0
	part.PublishAfter(&m, prev, func(off uint64, dup bool, err error) {
		if err != nil {
			done(protocol.PublishOK{}, b.publishError(q, idx, err))
			return
		}
		ok := protocol.PublishOK{Partition: idx, Offset: off, Duplicate: dup}
		if keyless {
			ok.Next = q.hint() // load.go
		}
		done(ok, nil)
	})
}

func (b *Broker) publishError(q *queueEntry, idx uint32, err error) error {
	if errors.Is(err, queue.ErrInvalidMessage) {
		return protocol.Errorf(protocol.CodeBadRequest, "%v", err)
	}
	if errors.Is(err, partition.ErrClosed) && q.deleted.Load() {
		return errDeletedMeanwhile(q.key)
	}
	if errors.Is(err, partition.ErrUnavailable) {
		return unavailableError(q, idx)
	}
	if b.cfg.Cluster != nil && errors.Is(err, partition.ErrNotLeader) && int(idx) < len(q.parts) {
		return b.ownerError(q, q.parts[idx])
	}
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe
	}
	return b.internalError("publish", q.key, err, "partition", idx)
}

func (b *Broker) checkPublish(p *protocol.Publish) error {
	if err := validName("topic", p.Topic, false); err != nil {
		return err
	}
	if err := validName("group", p.Group, true); err != nil {
		return err
	}
	if len(p.Body) > b.cfg.BodyBytesMax {
		return protocol.Errorf(protocol.CodeMessageTooLarge, "body is %d bytes, more than %d", len(p.Body), b.cfg.BodyBytesMax)
	}
	if len(p.Headers) > HeadersMax {
		return protocol.Errorf(protocol.CodeMessageTooLarge, "%d headers, more than %d", len(p.Headers), HeadersMax)
	}
	n := len(p.Key) + len(p.ContentType)
	for _, h := range p.Headers {
		if strings.HasPrefix(h.Key, partition.ReservedHeaderPrefix) {
			return protocol.Errorf(protocol.CodeBadRequest, "header %q: the %q prefix is reserved", h.Key, partition.ReservedHeaderPrefix)
		}
		n += len(h.Key) + len(h.Value)
	}
	if n > HeaderBytesMax {
		return protocol.Errorf(protocol.CodeMessageTooLarge, "key, content type and headers are %d bytes, more than %d", n, HeaderBytesMax)
	}
	if len(p.ProducerID) > dedup.ProducerIDBytesMax {
		return protocol.Errorf(protocol.CodeBadRequest, "producer id is %d bytes, more than %d", len(p.ProducerID), dedup.ProducerIDBytesMax)
	}
	if p.ProducerPrev != 0 && (p.ProducerID == "" || p.ProducerPrev >= p.ProducerSeq) {
		return protocol.Errorf(protocol.CodeBadRequest, "producer_prev %d needs a producer id and a higher producer_seq (%d)", p.ProducerPrev, p.ProducerSeq)
	}
	if p.DelayMs < 0 || p.NotBeforeMs < 0 || p.TTLMs < 0 {
		return protocol.Errorf(protocol.CodeBadRequest, "negative delay_ms, not_before_ms or ttl_ms")
	}
	return nil
}

// Stats returns per-queue and per-partition counters, ordered by topic and
// group.
func (b *Broker) Stats() Stats {
	b.mu.RLock()
	qs := make([]*queueEntry, 0, len(b.queues))
	for _, q := range b.queues {
		qs = append(qs, q)
	}
	b.mu.RUnlock()
	slices.SortFunc(qs, func(a, c *queueEntry) int {
		return cmp.Or(cmp.Compare(a.key.topic, c.key.topic), cmp.Compare(a.key.group, c.key.group))
	})
	var out Stats
	for _, q := range qs {
		out.Queues = append(out.Queues, b.statsOfQueue(q))
	}
	b.subsMu.Lock()
	out.Subscriptions = len(b.subs)
	b.subsMu.Unlock()
	return out
}

// statsOfQueue reads the counters of q's partitions.
func (b *Broker) statsOfQueue(q *queueEntry) QueueStats {
	qst := QueueStats{Topic: q.key.topic, Group: q.key.group}
	if b.cfg.Cluster != nil {
		qst.ReplicationWant = b.cfg.Cluster.ReplicationWant()
	}
	raft := q.meta.Load().Raft
	for i, p := range q.parts {
		s := p.Stats()
		qst.Partitions = append(qst.Partitions, PartitionStats{
			Partition: p.Index(), Quarantined: s.Quarantined, Err: s.Err,
			NextLSN: s.NextLSN, Frontier: s.Frontier, Ready: s.Ready, Delayed: s.Delayed,
			Inflight: s.Inflight, DeadLettering: s.DeadLettering, Consumers: s.Consumers,
			CheckpointFailures: s.CheckpointFailures, Relocated: s.Relocated, BytesOnDisk: s.BytesOnDisk,
			DedupProducers: s.Dedup.Producers, DedupEvictedIdle: s.Dedup.EvictedIdle,
			DedupEvictedLimit: s.Dedup.EvictedLimit, Duplicates: s.Duplicates,
		})
		if b.cfg.Cluster != nil && i < len(raft) {
			ps := &qst.Partitions[len(qst.Partitions)-1]
			ps.RaftGroup = raft[i].RaftGroup
			ps.Owner, ps.Term = b.partitionOwner(p)
			for _, r := range raft[i].Replicas {
				ps.Replicas = append(ps.Replicas, b.cfg.Cluster.ClientAddr(r))
			}
			voters, learners := p.RaftConf()
			for _, r := range voters {
				ps.Voters = append(ps.Voters, b.cfg.Cluster.ClientAddr(r))
			}
			for _, r := range learners {
				ps.Learners = append(ps.Learners, b.cfg.Cluster.ClientAddr(r))
			}
		}
	}
	return qst
}

// Ready reports whether the broker has recovered and is serving.
func (b *Broker) Ready() bool { return b.ready.Load() }

// newIncarnation returns a random name for a new queue's lifetime (see
// walGroup).
func newIncarnation() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}
