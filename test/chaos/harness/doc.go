// Package harness runs the real sinew binary as a child process for
// process-level fault tests: it builds the binary once, starts the broker with
// its own data directory and loopback ports, and delivers the faults a
// machine really sees (kill -9, SIGTERM with drain, SIGSTOP/SIGCONT, restart,
// a small tmpfs that fills up).
//
// Ownership: a Broker is driven by one goroutine at a time (the test or its
// nemesis); a private goroutine per process start waits for the child and
// records its exit. Every child runs in its own process group, is killed with
// its group from t.Cleanup, and dies with the test binary (parent-death
// signal), so a failed or timed-out test leaves no broker behind.
//
// Durability: the harness keeps nothing of its own; the broker's data
// directory outlives restarts until the test's temp dir is removed, and the
// broker's stderr is appended, across restarts, to one file whose tail goes
// into failure messages.
package harness
