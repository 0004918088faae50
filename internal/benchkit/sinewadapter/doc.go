// Package sinewadapter connects the benchkit workload engine to a Sinew broker
// through the Go SDK: a publish waits for the broker's confirm (the record is
// fsynced), and a consumer completes every message after the engine has handled
// it.
//
// Goroutines: the SDK runs its own per-connection goroutines. Each Consume adds
// a pump goroutine that feeds the engine's handler in delivery order and a
// bounded pool of settler goroutines that call Complete, so the handler never
// waits for a settle to become durable, as with the peers' fire-and-forget
// acknowledgements; the SDK batches those concurrent settles into one frame.
// Nothing here is durable; durability is the broker's.
package sinewadapter
