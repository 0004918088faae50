// Package cdp drives a headless Chromium through the Chrome DevTools Protocol,
// for tests that load Sinew's dashboard in a real browser.
//
// It speaks the protocol over --remote-debugging-pipe: Chromium reads
// NUL-terminated JSON commands on its file descriptor 3 and writes
// NUL-terminated replies and events on its descriptor 4. That needs no
// WebSocket, no open port and no module beyond the standard library. Only the
// few commands the tests use are wrapped (open a page, navigate, evaluate
// JavaScript, wait for a condition, capture a screenshot), and every console
// error, uncaught exception and browser log error of a page is recorded so a
// test can assert that there were none.
//
// Find locates the browser (the SINEW_CHROMIUM environment variable, then
// chromium, chromium-browser and google-chrome on PATH); a test that gets
// ErrNoBrowser skips with the message. scripts/install-chromium installs
// Debian's chromium.
//
// Goroutines: a Browser runs one reader goroutine, which decodes every message
// from Chromium, hands replies to the waiting Call and events to their Page;
// and one goroutine that waits for the process to exit. Close stops both: it
// asks Chromium to exit, and kills the browser's process group if it has not
// within a bounded time. Every Call is bounded by its context. Nothing is
// durable except the screenshots a test writes and the user-data directory it
// passes in.
package cdp
