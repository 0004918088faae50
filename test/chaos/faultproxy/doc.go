// Package faultproxy is a TCP proxy for loopback fault tests. Clients dial the
// proxy instead of the broker; the test then cuts every connection (a reset,
// as when a NAT or load balancer drops state), refuses new ones, stalls
// traffic with the sockets left open (a black-holed link), or delays it.
//
// Goroutines: one accept loop per proxy, and per proxied connection one reader
// and one writer per direction. Close stops them all and waits for them.
// Each direction's reader stamps a chunk when it arrives and the writer holds
// it until stamp+delay, so a delay adds latency without throttling
// throughput. At most chunksQueuedMax chunks wait per direction; beyond that
// the reader blocks and TCP backpressure reaches the sender.
//
// Nothing is durable.
package faultproxy
