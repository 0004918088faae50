// Package broker is Sinew's registry of queues, partitions and subscriptions.
//
// A queue is named by topic and group and has a fixed number of partitions,
// each run by its own partition actor (internal/partition). The broker
// validates and routes publishes (a key hashes to a stable partition with
// FNV-1a; keyless publishes go round-robin over the partitions being
// served), attaches subscriptions to partitions and keeps each subscription
// within its prefetch budget. Queues are created by Declare or on first use
// (publish or subscribe) with the broker's defaults, within a budget
// (Config.QueuesMax, QueuePartitionsMax, PartitionsTotalMax: beyond it,
// CodeLimitExceeded naming the limit). Delete removes a queue and Purge
// discards its queued messages. For operators (inspect.go), Config returns
// a queue's stored declaration, Peek reads a partition's unsettled messages
// without leasing them, Discard removes one queued message (a dead letter
// once it was replayed), and Counters are the event counts all partitions
// share.
//
// # Goroutines
//
// Besides the partition actors, the broker runs one dead-letter worker
// (deadletter.go), which creates missing dead-letter queues and publishes
// dead-letter copies for every partition so that no partition goroutine
// waits on queue creation; with Config.NodeWAL, the node WAL's goroutines
// (internal/wal); and in a cluster, one goroutine per PurgeQueue that waits
// (bounded by clusterPurgeWait) for every owner to report the purge.
//
// Publish, PublishChecked, Subscribe and Settle hand work to partitions
// without waiting for it (a full partition inbox answers
// CodeResourceExhausted), with one exception: a Publish or Subscribe to a
// queue that does not exist yet creates it on the caller's goroutine,
// under createMu (directory, meta file and partition logs, with their
// fsyncs; in a cluster, a controller commit waited for up to
// clusterCreateTimeout, 10 s). Declare, Delete and, in a cluster,
// PurgeQueue also block their caller on file work and the controller's
// commit. Completion callbacks and Consumer.Deliver run on partition
// goroutines; dead-letter copies are confirmed on the target partition's.
// Locks: createMu (creation and re-declaration, held across their
// file-system work and the controller's commit) before mu (the queue map)
// before subsMu (the subscription registry); the dead-letter worker's
// mutex is a leaf held only for a non-blocking send; a subscription's own
// mutex guards only its outstanding-delivery set and is never held while
// calling out.
//
// # Fair dispatch and prefetch
//
// Competing subscriptions on a queue are served round-robin by each
// partition, a few messages at a time. A subscription on all partitions
// shares one credit counter (its prefetch): partitions reserve credit before
// leasing, and a delivery returns it exactly once, when the consumer's
// settle is answered or when the partition reports that the lease ended
// otherwise (expired, released, dead-lettered; partition.Consumer.LeaseEnded),
// whichever comes first. A settle through the subscription holding the
// lease instead lets the partition spend that credit on the next lease in
// the same sync (partition.CreditCarrier): the settle is answered before
// that delivery, and one sync serves both. So the current deliveries a
// consumer holds never exceed its prefetch, and a consumer that lost a delivery (its frame died
// with a socket) gets its credit back when the lease expires instead of
// starving. A partition that finds no credit marks the
// subscription starved and is poked when credit comes back.
//
// A consumer may also bound what it takes in bytes (PausableConsumer): a
// subscription then reserves credit only for deliveries that fit the room it
// reports, counting those reserved and not yet delivered at the average size
// of its past deliveries, and none while the room is zero; the consumer's
// Subscription.Wake, or a delivery leaving transit, pokes the partitions
// again. The server's connections use it to cap what they queue for a
// client that does not read.
//
// # What is durable when
//
// A publish is confirmed once its Enqueue record is as durable as the sync
// policy promises (partition.Partition.persist): fdatasync'd by its
// partition under seglog.SyncAlways (the default), or by the node WAL's
// commit with Config.NodeWAL; only written to the OS under
// seglog.SyncInterval (it survives a process crash, and a power loss only
// once the interval's fsync ran); in a cluster, also committed by a quorum
// of the partition's replicas. A settle likewise. Queue definitions live in
// DataDir/queues/<topic>/<group>/meta (names mapped to file names of at
// most 255 bytes, see dirName), written atomically before the queue is
// used, so a restart recovers every queue with its settings. Delete renames
// the queue's directory into DataDir/queues/.trash and syncs both parents
// before it answers, then removes it; Open empties the trash, so a crash
// leaves a queue either whole or gone. A purge is a DeadLetter record
// without target per message (reason purged), durable before it is
// answered. Partitions live in .../p<N>/ (log/ and
// checkpoint). Subscriptions are not durable here; a lease records its
// subscription's owner string. A plain Subscribe names it after this
// process ("b" + start time + "." + id), so its leases cannot be claimed
// after a restart; SubscribeWith takes an owner prefix from the caller
// (the session layer passes owner id "/" client id, both stable) and a
// subscription id that ReserveSubIDs keeps from ever being handed out
// again, so the owner in the log names the same subscription after a
// restart. Leases found in the log at Open stay leased for
// Config.RecoveredLeaseGraceMs (sinew serve: connection.restart_grace_ms);
// a subscription restored within it with SubscribeOptions.Adopt takes its
// own back (partition.Partition.Adopt) and gets them delivered again, and
// the rest go back to ready (a release: no retry used) when it ends, at
// once by default. Leases past their deadline expire as usual.
//
// # The data dir lock
//
// One broker owns a data dir at a time. Open takes an exclusive lock on
// DataDir/LOCK (flock on the OS file system, see vfs.FS.Lock) before it
// reads anything in the dir, holds it until Close, and fails at once with a
// *DataDirLockedError naming the holder's pid if another broker, in this
// process or another, has it. A caller that must hold the dir before Open
// (sinew serve binds its listeners in between) takes the lock with
// LockDataDir and hands it over in Config.Lock. The kernel drops the lock
// when its process dies, so a crash leaves no stale lock.
//
// # Damage and errors
//
// A partition whose log or checkpoint fails verification at Open is handled
// by Config.Quarantine: parked and reported (the default), fatal to Open, or
// cut at the damage and reopened with a loud warning. A partition that is
// quarantined or failed (a write or sync error at run time) answers
// CodeUnavailable to publishes, settles and purges and to a Subscribe at
// once, naming the partition; Problems lists them for /readyz.
//
// Errors sent to peers never carry server paths: a failure inside the
// broker (a file-system error creating a queue, say) is logged with its
// operation, topic, group and partition, and the peer gets CodeInternal
// naming the operation only.
package broker
