// Package natsjs adapts NATS JetStream to the benchkit workload engine, configured
// as a durable work queue: file storage, work-queue retention, one durable pull
// consumer with explicit acknowledgement, and publishes that wait for the
// stream's acknowledgement. Whether that acknowledgement follows an fsync is a
// server setting (jetstream.sync_interval), so the same adapter serves both the
// default and the fsync-always configuration under different names.
//
// Goroutines: the nats.go client runs its own reader and flusher per
// connection; Consume's handler runs on the client's per-consumer delivery
// goroutine. The adapter keeps no state of its own beyond the connections.
package natsjs
