// Package broker is Sinew's registry of queues, partitions and subscriptions.
//
// A queue is named by topic and group and has a fixed number of partitions,
// each run by its own partition actor (internal/partition). The broker routes
// publishes to partitions (by key hash, or round-robin when there is no key),
// attaches subscriptions to partitions and keeps each subscription within its
// prefetch budget.
package broker
