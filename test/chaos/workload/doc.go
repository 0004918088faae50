// Package workload drives a Sinew broker the way the chaos tests need: it
// speaks the wire protocol directly (package protocol), so that what it
// records is exactly what the broker said, with no client library between.
//
// Producers publish sequence numbers 1..N under their own producer id, the id
// and sequence written in a checksummed body (checker.AppendBody). Each
// unconfirmed publish is resent with the same id and sequence after a
// reconnect or a retryable error. Consumers subscribe with manual ack, record
// every delivery and ack it at once, and record every ack the broker confirms.
// All of it goes into a checker.Checker.
//
// Goroutines: Start launches one goroutine per producer and per consumer
// (each the sole owner of its state), and per live connection one reader (for
// producers) and one heartbeat sender. StopProducers and Stop cancel them and
// wait for every one to return.
//
// Nothing is durable; the broker holds all state that matters.
package workload
