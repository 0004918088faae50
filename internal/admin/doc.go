// Package admin serves Sinew's operator HTTP endpoints:
//
//	GET /               the dashboard page (package dashboard); its files under /ui/
//	GET /healthz        200 "ok" while the process runs
//	GET /readyz         200 once the broker has recovered and serves every partition;
//	                    503 before, and while any partition is quarantined or failed
//	                    (the body names each one and why)
//	GET /metrics        Prometheus exposition (text format 0.0.4, or what the scraper negotiates)
//	GET /api/v1/queues    JSON: per-queue, per-partition counts
//	GET /api/v1/settings  JSON: the runtime settings, their version and which keys they are
//	PUT /api/v1/settings  change runtime settings: {"version": N, "values": {...}};
//	                      200 once persisted, 409 when N is not current, 400 for a bad
//	                      key or value
//
// The handler holds no state of its own; every request calls the functions in
// Config, which read the broker's and server's counters, or the runtime settings
// store. It starts no goroutines (the caller runs the http.Server). A PUT of the
// settings is durable when it answers 200: the store persists it first.
//
// The metrics exposition is client_golang's promhttp over the Gatherer the caller
// passes; sinew serve's collector reads the broker's and server's counters at
// scrape time.
package admin
