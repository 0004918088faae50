// Package chaos holds Sinew's process-level fault scenarios. Each scenario
// builds the real sinew binary (once per test binary), runs it as a child
// process with its own data directory and loopback ports, drives it with the
// protocol-level workload (package workload) and injects one kind of fault
// (a nemesis) while messages flow:
//
//	kill9      SIGKILL, then restart on the same data dir
//	term       SIGTERM; the broker must drain and exit 0; then restart
//	pause      SIGSTOP for a while, then SIGCONT
//	proxycut   every client connection reset through a TCP proxy
//	proxystall traffic held with sockets open, then released
//	proxydelay added latency on every chunk
//	diskfull   the data dir's tmpfs filled to ENOSPC, then freed (and restarted)
//
// After the faults stop, the broker is healed, producers stop and consumers
// drain. The checker (package checker) then judges the run: a confirmed
// message never delivered, or a settled message delivered again, fails the
// test with the offending sequence numbers and the broker's stderr tail.
// Assertions check only invariants that hold however the faults fall.
//
// The cluster scenarios (cluster_test.go) run three `sinew serve --cluster`
// nodes on loopback and kill or stop a partition's owner or the controller's
// leader under load through the Go SDK, with the LAN failure-detection
// profile (SINEW_CHAOS_CLUSTER_PROFILE=seed runs them with the seed's
// timings; SINEW_CHAOS_CLUSTER_LEASE_MS sets the workload's lease, 2 s by
// default), or make a node join and another leave. The partition scenario
// (partition_test.go) runs each node in a network namespace it creates
// (package netlab), opens the clients' connections from another one, and
// takes a partition owner's link down and up again; it needs root and the
// ip command, and skips with the reason otherwise.
//
// The short run is part of `go test ./...`. A long run (SINEW_CHAOS_SECONDS
// per scenario) is driven by scripts/chaos, which prints a summary table.
//
// The tests own their child processes and kill every one from t.Cleanup.
package chaos
