// Package hostile measures what misbehaving peers cost a real broker. Each test
// builds the sinew binary once, runs `sinew serve` as a child process (package
// test/chaos/harness), optionally fills a queue with a backlog, and then opens
// many hostile connections at once:
//
//	garbage    random bytes instead of frames, reconnecting when closed
//	hugelen    a length prefix far above the frame limit, or one just under it
//	           followed by silence
//	slowloris  a HELLO sent one byte at a time
//	halfopen   a connection that never sends a byte, or a HELLO then silence
//	nonreader  a consumer that subscribes with a large prefetch to the backlog (or,
//	           in the bounded test, one to a queue of 64 KiB messages), sends a
//	           PING now and then, and never reads its socket
//	wrongauth  a HELLO with a wrong credential, again and again, from 127.0.0.2
//	           (bounded test)
//	oversized  whole frames over the body or the frame limit (bounded test)
//
// While they run, the broker's resident memory (VmRSS, and VmHWM for the
// peak) is sampled from /proc/<pid>/status.
//
// TestHostileBounded runs in the default suite against a broker with
// auth.tokens set: a small backlog, 170 peers for a few seconds, and an
// assertion that the broker's peak RSS stays under a ceiling derived from the
// configured per-connection byte caps. The full
// measurement (TestHostileMeasure, figures in docs/reliability.md) runs only
// with SINEW_HOSTILE_MEASURE=1; SINEW_HOSTILE_BACKLOG and
// SINEW_HOSTILE_SECONDS set its size and length.
//
// BenchmarkPublishUnderHostile measures a well-behaved client's publish
// p50/p99 alone and then under the bounded test's 170 peers, against the same
// broker in one run (figures in docs/benchmarks.md).
//
// The tests own their child process and kill it from t.Cleanup; every hostile
// goroutine stops when the phase's context ends.
package hostile
