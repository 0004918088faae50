// Package testkit holds test helpers shared by Sinew's packages: a
// fault-injecting TCP proxy (cut, refuse, stall and delay connections on
// loopback) and a fake clock whose timers fire only when the test advances it.
//
// Goroutines: a Proxy runs one accept goroutine and two copy goroutines per
// proxied connection; Close stops them all. The Clock starts none. Nothing is
// durable.
package testkit
