// Package queue is the state machine of one Sinew partition: which messages
// are ready, delayed, inflight (leased), dead-lettering or settled, with
// leases, retries, delays, TTLs and dead-lettering.
//
// # Shape
//
// The package is pure: no goroutines, no clock (time arrives as nowMs, Unix
// milliseconds), no I/O, no randomness. It is event-sourced. Commands
// (Enqueue, Lease, Ack, Nack, Fail, Release, Extend, Tick, DeadLettered,
// Purge, Relocate) look at the current state and return events without changing
// it. The partition actor appends each event to its log, learns its LSN and
// calls Apply(lsn, event) before the next command. The state is therefore a function of the
// checkpoint and the events applied after it, and a replay after a crash
// arrives at exactly the state the crashed process had. Apply never reads the
// Config: every decision a command made (the dead-letter target, the retry
// verdict, the lease id) is written into the event.
//
// # Offsets and settled history
//
// A message's offset is the LSN of its Enqueue event. Every other event also
// takes an LSN, settled as soon as it is applied, and LSNs the queue never
// sees (other record types in the same log) are settled too. Every LSN below
// NextLSN is in exactly one state; settled ones carry no memory at all. The
// settled set is the complement of the unsettled messages below NextLSN, so
// its coalesced ranges are simply the gaps between unsettled offsets: the
// queue keeps no separate interval list that could drift from the message
// index or cost O(ranges) to split and join, and Stats reports the number of
// ranges, maintained in O(1) per settle. Frontier, the lowest unsettled LSN,
// only moves forward; the log below it is only history.
//
// A message's body lives in its Enqueue record until a Relocate event copies
// it to the log's tail (the partition does so for the few live messages left
// in old segments, so retention can drop them). The offset stays the
// message's identity; BodyLSN says where its body is now, and BodyFloor, the
// lowest LSN holding a live body, is how far retention may go. Relocations
// are applied, replayed and snapshotted like any event.
//
// Only unsettled messages are held in memory, and most of them as two
// bits. A plain message (enqueued without a not-before or a TTL, and not
// leased since) is nothing but its bit in a chunked bitmap of the
// unsettled LSNs: it is ready with attempt 0 and needs no record, so a
// backlog nobody consumes costs about half a byte per message, whatever
// other events (leases, acks, raft no-ops) took LSNs between its messages.
// The first event that gives a message state of its own (a lease, mostly)
// gives it an 80-byte entry in a slab, found through its bitmap chunk,
// which lists its messages' slab positions in offset order; so does an
// enqueue with a delay or a TTL. Four heaps order the entries by offset
// (ready ones), not-before, lease deadline and TTL; an entry that only has
// a TTL and was never leased is found by a bit like a plain message and
// needs no item in the first. Each owner's
// leases are linked through their entries, so Inflight(owner), which a
// detaching consumer needs, walks that owner's leases only. Heap entries
// are deleted lazily and everything is compacted once garbage outweighs
// live data, so each command costs O(log n) amortized and memory follows
// the messages with state, not the backlog. Keys, headers and bodies are
// never retained: delivery reads them back from the log by offset.
//
// LSNs that hold no queue event (other record types, a raft leader's
// no-op or configuration change) are settled gaps: Apply of a later LSN
// skips them, and ApplyGap settles one that no event follows yet. They
// cost nothing once their bitmap chunk holds no unsettled message.
//
// # Ownership and durability
//
// One goroutine, the partition actor, owns a State. Nothing in it is
// durable by itself: an event is durable once the log has synced it, and the
// actor must not act on an event's consequences (deliver a lease, confirm an
// ack) before that. Snapshot produces a checkpoint covering every LSN below
// NextLSN; Restore plus replay of the later log rebuilds the state.
//
// # Lifecycle of a message
//
//	from            cause                                  to
//	--------------  -------------------------------------  -----------------------------------
//	(none)          Enqueue                                ready; delayed if not_before > now
//	delayed         now reaches not_before                 ready
//	ready           Lease                                  inflight (attempt+1, lease id, deadline)
//	ready, delayed  TTL passes (Tick; Lease on its way)    DeadLetter(expired)
//	ready, delayed  Purge                                  DeadLetter(purged), always discarded
//	inflight        Ack                                    settled
//	inflight        Extend (current lease only)            inflight, new deadline; same lease id and attempt
//	inflight        Nack, lease deadline (Tick)            ready; delayed for Nack with not_before
//	                  ... but counted >= MaxRetries+1      DeadLetter(retries_exhausted)
//	                  ... but TTL has passed               DeadLetter(expired)
//	inflight        Release (holder went away)             ready, released+1; not counted
//	                  ... but TTL has passed               DeadLetter(expired)
//	inflight        Fail                                   DeadLetter(failed)
//	DeadLetter      target ""                              settled (discarded)
//	                  ... but DeadLetter.Keep              never happens: see below
//	DeadLetter      target set                             dead_lettering
//	dead_lettering  DeadLettered (copy durable in target)  settled
//
// A message is delayed or ready depending only on nowMs. TTL never cuts a
// lease short; it is checked when the message comes back.
//
// # Attempts and retries
//
// Attempt counts leases: the first delivery is attempt 1, and every delivery
// raises it, however the previous one ended, so a consumer always sees how
// often a message has been handed out and a poison message stays visible.
// Retries count only failed deliveries: counted = Attempt - released, where
// released is the number of deliveries that ended in Release, because the
// holder went away (a disconnect, a session's grace expiry, an unsubscribe,
// or a lease recovered after a restart). A NACK fails a delivery, and so does
// a lease that expires while its holder is still connected. MaxRetries 5
// therefore allows 6 counted deliveries (the requeue after the sixth failed
// one dead-letters), plus up to ReleasesUncountedMax released ones; after
// that, releases count too. UnlimitedRetries
// turns the retry limit off: Attempt then saturates at 2,000,001 instead of
// wrapping. The released count is kept per message, is derived from the
// Requeue events' reasons in Apply, and travels in the snapshot.
//
// # Queues that keep everything
//
// With DeadLetter.Keep (dead-letter queues use it) a message leaves only by
// Ack: retries are unlimited, TTLs are not enforced, and Fail puts the message
// back to ready at once, as a Nack would. The commands make these choices, so
// the events, and hence replay, are the same kinds as everywhere else.
package queue
