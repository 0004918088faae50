// Package benchkit is Sinew's workload engine: the same publish, drain and mixed
// workloads run against any broker through the small Broker/Conn adapter
// interface, so `sinew bench` and the side-by-side comparison in bench/ measure
// Sinew and its peers the same way.
//
// Workloads (see Mode):
//
//   - publish: Window goroutines, each with one publish in flight that waits for
//     the broker's confirm; throughput and publish-to-confirm latency.
//   - drain:   prefill Count messages, then consume and acknowledge them with
//     Prefetch; the drain rate, and the broker's RSS with the backlog waiting.
//   - mixed:   publishes paced at RatePerSec with live consumers; latency from the
//     moment each message was due (stamped in its body) to its delivery.
//
// Latency goes into a log-linear histogram (Histogram) with under 1 % relative
// error. The broker's RSS and CPU time come from procfs (ReadProc) when a pid is
// given.
//
// Goroutines: Run owns a run. It starts Window publisher goroutines, one pacer in
// mixed mode, one progress printer and, in drain's prefill, one watcher that
// ends the phase when it stops making progress, and waits for all of them before it
// returns. Consumer callbacks run on the adapter's goroutines and touch only
// atomics and the histogram, whose buckets are atomic counters. Nothing is
// durable: results live in memory until the caller prints them.
//
// Time comes from Config.Clock and procfs from Config.ProcFS, so tests can run the
// engine against an in-memory broker inside a testing/synctest bubble.
package benchkit
