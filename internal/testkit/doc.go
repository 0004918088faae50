// Package testkit holds test helpers shared by Sinew's packages: a
// fault-injecting TCP proxy (cut, refuse, stall and delay connections on
// loopback), a fake clock whose timers fire only when the test advances it,
// and StartBroker, which runs a broker behind the real wire server on
// loopback.
//
// Goroutines: a Proxy runs one accept goroutine and two copy goroutines per
// proxied connection; Close stops them all. The Clock starts none. StartBroker
// runs the server's Serve goroutine (and the server's and broker's own) until
// the test's cleanup shuts them down. Nothing is durable, except what a broker
// started WithDataDir writes under that directory.
package testkit
