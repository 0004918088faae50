// Package e2e holds Sinew's end-to-end tests (package e2e_test). They run the real
// broker and server over loopback TCP, mostly with raw protocol frames: every
// settle kind, prefetch, competing consumers, lease expiry, delays, TTL, dead
// letters, partitions and acks across a restart. SDK clients are driven across a
// cut socket (a DELIVER lost with it is re-sent after the resume) and across a
// drain and restart. A crash test builds the sinew binary, kill -9s it in the
// middle of a publish stream and checks that every confirmed publish is there
// after a restart; it is skipped with -short.
//
// Nothing here runs outside tests; each test owns its temporary data directory and
// stops every goroutine and child process it starts.
package e2e
