package broker

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/dedup"
	"github.com/sinewmq/sinew/internal/delivery"
	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

// QuarantinePolicy says what Open does with a partition whose log or
// checkpoint fails verification.
type QuarantinePolicy int

const (
	// Quarantine (the default) parks the damaged partition: it is not
	// served (publishes and subscribes to it get CodeUnavailable) and the
	// damage is logged with its segment and offset, while every other
	// partition runs. An operator repairs or removes it and restarts.
	Quarantine QuarantinePolicy = iota
	// Refuse makes Open fail on the first damaged partition.
	Refuse
	// Ignore reopens a damaged log cut at its first bad record and logs a
	// loud warning. Confirmed records after the damage are lost; use it
	// only to get a broker serving again when the data behind the damage
	// is known to be expendable.
	Ignore
)

func (q QuarantinePolicy) String() string {
	switch q {
	case Quarantine:
		return "quarantine"
	case Refuse:
		return "refuse"
	case Ignore:
		return "ignore"
	}
	return "quarantine_policy(" + strconv.Itoa(int(q)) + ")"
}

// Defaults for Config fields left zero.
const (
	DefaultPartitionsDefault      = 1
	DefaultLeaseMsDefault         = 30_000
	DefaultMaxRetriesDefault      = 5
	DeadLetterTopicDefault        = "sinew.dead-letter"
	InboxMaxDefault               = 4096
	BodyBytesMaxDefault           = 1 << 20
	PrefetchMaxDefault            = 10_000
	PrefetchDefault               = 100
	CheckpointEveryRecordsDefault = 100_000
	// QueuesMaxDefault, QueuePartitionsMaxDefault and
	// PartitionsTotalMaxDefault bound what creation (declared or on first
	// use) may add; see Config.
	QueuesMaxDefault          = 1000
	QueuePartitionsMaxDefault = 64
	PartitionsTotalMaxDefault = 4096
	// PartitionsMax bounds the partitions of one queue, whatever
	// Config.QueuePartitionsMax says.
	PartitionsMax = 1024
	// NameBytesMax bounds topic and group names.
	NameBytesMax = 255
	// HeadersMax bounds the headers of one published message.
	HeadersMax = 64
	// HeaderBytesMax bounds the summed key and value bytes of one message's
	// headers.
	HeaderBytesMax = 64 << 10
)

// Config configures a Broker. Zero values mean the documented default.
type Config struct {
	// DataDir is the root of everything the broker stores.
	DataDir string
	// Cluster, when set, makes the broker a cluster node: queues are
	// created through the controller's catalogue and their partitions
	// are replicated raft groups (cluster.go). Nil: a single node.
	Cluster Cluster
	// Users, when set, is the users store the broker serves (sinew serve
	// opens it first, to apply the startup rule before recovery); nil opens
	// DataDir/meta/users with UserHashParams.
	Users *auth.Users
	// UserHashParams are the argon2id parameters of new password hashes
	// when the broker opens the users store; zero means
	// auth.DefaultHashParams.
	UserHashParams auth.HashParams
	// FS is the file system; default vfs.OS().
	FS vfs.FS
	// Now is the clock; default time.Now.
	Now func() time.Time
	// OnSync, when set, is told of every sync that made a partition's
	// stage durable: the records it covered and how long it took (for the
	// fsync histograms). It runs on partition syncer goroutines and must
	// not block.
	OnSync partition.SyncObserver
	// Logger receives recovery and quarantine reports, internal errors with
	// their context, and queue deletions and purges; default discards.
	Logger *slog.Logger
	// Lock is DataDir's lock, already taken with LockDataDir by a caller
	// that must hold it before Open (to bind listeners first, say). Open
	// takes it over: Close releases it, and so does a failed Open. Nil
	// means Open takes the lock itself, before it reads anything.
	Lock *DataDirLock

	// DefaultPartitions is the partition count of queues created on first
	// use (default 1, at most QueuePartitionsMax).
	DefaultPartitions int
	// QueuesMax bounds the queues the broker holds (default 1000), so a peer
	// publishing to mistyped or random names cannot create queues without
	// end. Creation beyond it, declared or on first use, is
	// CodeLimitExceeded naming limits.queues_max. Dead-letter queues (the
	// global one, and the targets the broker creates to hold dead-letter
	// copies) are exempt and not counted, so dead-lettering never fails for
	// lack of budget. Queues found at Open are all recovered, even above
	// the limit.
	QueuesMax int
	// QueuePartitionsMax bounds the partitions of one new queue (default
	// 64, at most PartitionsMax); above it is CodeLimitExceeded naming
	// limits.queue_partitions_max.
	QueuePartitionsMax int
	// PartitionsTotalMax bounds the partitions summed over every queue
	// (default 4096); a creation that would pass it is CodeLimitExceeded
	// naming limits.partitions_total_max. Dead-letter queues are exempt, as
	// for QueuesMax.
	PartitionsTotalMax int
	// DefaultLeaseMs is how long a delivery is leased when a queue does
	// not say (default 30000).
	DefaultLeaseMs int64
	// DefaultMaxRetries is the redeliveries a message gets when a queue
	// does not say (default 5). Only failed deliveries use one up: a NACK,
	// or a lease that expires while its holder is still connected. A lease
	// handed back because its holder went away (disconnect, session grace
	// expiry, unsubscribe, recovered leases released after a restart) does
	// not count; the delivery attempt still rises (see queue.Config).
	DefaultMaxRetries int
	// DeadLetterTopic names the global dead-letter queue (default
	// "sinew.dead-letter"). Like every dead-letter queue it keeps what it
	// holds: no retry limit, no TTL, FAIL puts a message back to ready, and
	// a message leaves only when completed or purged.
	DeadLetterTopic string
	// deadLetterJobsMax overrides deadLetterJobsMax (tests).
	deadLetterJobsMax int
	// walSegmentBytes overrides the node journal's segment size (tests).
	walSegmentBytes int64
	// DelayMsMax caps how far ahead a publish may schedule its first
	// delivery (delay_ms, or not_before_ms from now); TTLMsMax caps a
	// publish's ttl_ms and a queue's default_ttl_ms; NackDelayMsMax caps
	// a NACK's delay. Each defaults to 30 days (DelayMsMaxDefault,
	// TTLMsMaxDefault, NackDelayMsMaxDefault) and is at most TimeCapMsMax.
	// Input beyond a cap is refused with bad_request naming it; a NACK is
	// refused, not clamped, and its lease stays held (see caps.go).
	DelayMsMax     int64
	TTLMsMax       int64
	NackDelayMsMax int64

	// Sync, SyncIntervalMs and SegmentBytes configure every partition log.
	Sync           seglog.SyncPolicy
	SyncIntervalMs int
	SegmentBytes   int64
	// Preallocate picks how partition log segments get their space (see
	// seglog.PreallocMode; default seglog.PreallocReserve).
	// seglog.PreallocZero makes each fdatasync cheaper (no extent
	// conversion to journal) at the cost of writing every segment twice;
	// docs/benchmarks.md has the measured effect on confirmed publishes.
	Preallocate seglog.PreallocMode

	// Quarantine says what to do with damaged partitions at Open.
	Quarantine QuarantinePolicy

	// InboxMax bounds each partition's command inbox (default 4096). A
	// full inbox answers CodeResourceExhausted.
	InboxMax int
	// BodyBytesMax bounds a published body (default 1 MiB).
	BodyBytesMax int
	// PrefetchMax bounds a subscription's prefetch (default 10000).
	PrefetchMax int
	// CheckpointEveryRecords is how many log records a partition appends
	// between checkpoints (default 100000).
	CheckpointEveryRecords int
	// Dedup bounds each partition's producer deduplication window (see
	// internal/dedup); zero fields take its defaults. WindowSeqs must be at
	// least the most publishes a client may have unconfirmed, or a resend
	// can fall below the window and be refused as sequence_too_old.
	Dedup dedup.Config
	// BodyCacheBytes bounds the cache of recently published payloads,
	// which spares the publish-then-consume path a log read: one budget
	// for the whole broker, shared by every partition, the coldest giving
	// back first (default BodyCacheBytesDefault; negative disables the
	// cache). RaftCacheBytes is the same for the raft entries kept in
	// memory until applied (default RaftCacheBytesDefault). See Budgets.
	BodyCacheBytes int
	RaftCacheBytes int
	// RecoveredLeaseGraceMs is how long leases recovered from the log at
	// Open stay with their holders, whose sessions did not survive the
	// restart. After it every recovered lease still outstanding goes back
	// to ready (not counted as a failed attempt; the next delivery's
	// Attempt still rises) instead of
	// waiting out its lease. Default 0: released at startup. A
	// subscription restored within the grace with SubscribeOptions.Adopt
	// keeps its leases (partition.Partition.Adopt).
	RecoveredLeaseGraceMs int64
}

// Consumer receives a subscription's deliveries.
type Consumer interface {
	// Deliver hands over one leased message. It is called from partition
	// goroutines, possibly several at once for a subscription on all
	// partitions, and MUST NOT block. The number of outstanding
	// deliveries per subscription (not settled, and whose lease has not
	// ended otherwise) never exceeds its prefetch, so the consumer can
	// buffer them. A delivery whose lease expired or was released no
	// longer counts: its message may be delivered again (to this consumer
	// too) and settling the old lease gets CodeStaleLease. d.Body and d.Key may be shared with
	// other deliveries of the same message and must not be modified.
	Deliver(s *Subscription, d Delivery)
	// Closed tells the consumer the broker ended the subscription (queue
	// quarantined, shutdown ...). It is not called for Subscription.Close.
	Closed(s *Subscription, reason uint8, err error)
}

// LeaseEndedConsumer may be implemented by a Consumer that wants to know
// when a delivery it holds stops counting against its prefetch without its
// own settle (the lease expired, was released or dead-lettered), for
// instance to drop a buffered frame that can no longer be settled.
type LeaseEndedConsumer interface {
	// LeaseEnded is called from a partition goroutine, after the Deliver
	// of that lease, and MUST NOT block.
	LeaseEnded(s *Subscription, partition uint32, offset, leaseID uint64)
}

// PausableConsumer may be implemented by a Consumer whose room for deliveries
// is bounded in bytes, such as one behind a connection with a byte-capped
// write queue. The subscription then reserves credit only for what fits:
// with each delivery's size estimated from those delivered so far, the
// deliveries leased and not yet handed over never exceed RoomBytes. At zero
// or below nothing more is leased until the consumer calls
// Subscription.Wake.
type PausableConsumer interface {
	// RoomBytes is called from partition goroutines before they reserve
	// credit. It MUST NOT block and should be cheap (atomic loads).
	RoomBytes() int64
}

// Delivery is one leased message (internal/delivery), with the queue's
// topic, group and partition index filled in.
type Delivery = delivery.Delivery

// PartitionStats are one partition's counters.
type PartitionStats struct {
	Partition uint32
	// Elsewhere: in a cluster, this node holds no replica of the
	// partition; only its placement (RaftGroup, Replicas) is known here.
	Elsewhere     bool
	Quarantined   bool
	Err           string // why the partition is quarantined or failed
	NextLSN       uint64
	Frontier      uint64
	Ready         int
	Delayed       int
	Inflight      int
	DeadLettering int
	Consumers     int
	// CheckpointFailures counts failed checkpoint attempts since the
	// partition opened; failures back off exponentially.
	CheckpointFailures uint64
	// Relocated counts message bodies copied to the log's tail so that
	// retention could drop the old segments they pinned.
	Relocated uint64
	// DedupProducers is how many producers the deduplication window
	// remembers; DedupEvictedIdle and DedupEvictedLimit count those it
	// forgot since the partition opened, after their idle time or to stay
	// within its bounds. A forgotten producer's resends are stored again.
	DedupProducers    int
	DedupEvictedIdle  uint64
	DedupEvictedLimit uint64
	// Duplicates counts publishes answered with an earlier store's offset.
	Duplicates uint64
	// BytesOnDisk is the size of the partition's log segments.
	BytesOnDisk int64
	// In a cluster: RaftGroup is the partition's raft group id, Replicas
	// the client addresses of the nodes holding a replica (preferred owner
	// first), Owner the client address of its raft leader ("" while none
	// is known) and Term the raft term this replica knows. Empty on a
	// single node.
	RaftGroup uint64
	Replicas  []string
	Owner     string
	Term      uint64
	// Voters and Learners are the raft group's configuration as this
	// replica applied it (client addresses): Replicas is where the
	// placement wants the partition, these where it is.
	Voters, Learners []string
}

// QueueStats are one queue's counters.
type QueueStats struct {
	Topic, Group string
	Partitions   []PartitionStats
	// ReplicationWant is, in a cluster, how many replicas the queue
	// should have (Cluster.ReplicationWant); 0 on a single node.
	ReplicationWant int
}

// Stats is a point-in-time view of every queue, ordered by topic and group.
type Stats struct {
	Queues        []QueueStats
	Subscriptions int
}
