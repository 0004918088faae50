// Package sinewadapter connects the benchkit workload engine to a Sinew broker
// through the Go SDK: a publish waits for the broker's confirm (the record is
// fsynced), and a consumer completes every message after the engine has handled
// it.
//
// Goroutines: the SDK runs its own per-connection goroutines. Each Consume adds
// one pump goroutine that feeds the engine's handler in delivery order and then
// completes the message with CompleteAsync, so the consumer never waits for a
// settle to become durable, as with the peers' fire-and-forget acknowledgements;
// the SDK's settler batches the queued settles into one frame.
// Nothing here is durable; durability is the broker's.
package sinewadapter
