// Package dashboard serves Sinew's operator dashboard: one hand-written page
// (HTML, CSS and JavaScript embedded in the binary, no framework, no build
// step, nothing loaded from another origin) that polls the admin API under
// /api/v1/ and shows
//
//   - an overview with publish, deliver and ack rates per second, computed in
//     the page from two reads of the overview's counters;
//   - the queues with their counts, state and depth over time (inline SVG);
//   - the sessions, attached and dormant, with a grace countdown;
//   - the dead letters, with inspect and replay (keeping the copy or not);
//   - the runtime settings in a form, whose save sends the version it was
//     based on, so a concurrent change is refused (409) and shown, never
//     overwritten.
//
// The page refreshes itself every 2 s (?refresh=ms changes it, between 250 ms
// and 60 s). Mount registers it on the admin listener's mux at "/" and its
// assets under "/ui/". Every answer carries a Content-Security-Policy that
// allows only the admin listener's own origin, so the page cannot load
// anything from elsewhere even by mistake.
//
// The package holds no state and starts no goroutines; the files are read
// from the embedded file system.
package dashboard
