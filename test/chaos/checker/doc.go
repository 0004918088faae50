// Package checker judges a Sinew workload run against the broker's delivery
// contract. It is a pure recorder: the workload tells it which publishes were
// attempted and confirmed, which deliveries arrived and which acks were
// confirmed, each with a timestamp the caller measured; the checker reads no
// clock, starts no goroutine and does no I/O.
//
// The figures it reports and what the contract says about them:
//
//	lost                 confirmed (PUBLISH_OK) but never delivered      must be 0
//	settled-redelivered  delivered again from a (partition, offset)      must be 0
//	                     whose ack was confirmed
//	phantom              delivered but never published by the workload   must be 0
//	corrupt              delivered with a body that does not verify      must be 0
//	duplicates           deliveries beyond the first of each message     counted, bounded by faults
//	dedup misses         one producer sequence stored at two positions   counted
//	longest gap          longest stretch with no delivery at all         availability, not correctness
//
// Ordering: a Checker is safe for concurrent use; one mutex orders every
// record. "Delivered again after its ack was confirmed" is judged in that
// order. The order is sound for a correct broker: an ack that returns ok held
// the only live lease, so no other delivery of the message could have been
// created before the settle became durable, and none may be created after.
//
// Nothing here is durable; a Checker lives for one run.
package checker
