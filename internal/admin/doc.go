// Package admin serves Sinew's operator HTTP endpoints (docs/operations.md
// documents every one with its JSON):
//
//	GET    /                                  the dashboard page (package dashboard); its files under /ui/
//	GET    /healthz                           200 "ok" while the process runs
//	GET    /readyz                            200 once recovered and every partition serves; 503 otherwise
//	GET    /metrics                           Prometheus exposition
//	GET    /api/v1/version                    version and API version
//	GET    /api/v1/overview                   identity, uptime, totals and counters since start
//	GET    /api/v1/queues                     every queue with its partitions
//	GET    /api/v1/queues/{topic}?group=      one queue
//	PUT    /api/v1/queues/{topic}?group=      declare (create, or set its whole configuration)
//	PATCH  /api/v1/queues/{topic}?group=      change some limits of an existing queue
//	DELETE /api/v1/queues/{topic}?group=      delete the queue and its messages
//	POST   /api/v1/queues/{topic}/purge       discard its queued messages
//	GET    /api/v1/queues/{topic}/messages    inspect a partition's unsettled messages
//	GET    /api/v1/deadletters                list a dead-letter queue with reasons and sources
//	POST   /api/v1/deadletters/replay         publish chosen dead letters back to their source
//	GET    /api/v1/connections                open client connections
//	GET    /api/v1/sessions                   sessions, attached and dormant, with grace left
//	GET    /api/v1/settings                   runtime settings and their version
//	PUT    /api/v1/settings                   change runtime settings (409 on a version race)
//	POST   /api/v1/drain                      start the planned drain, as SIGTERM does (202; 501 when not wired)
//	GET    /api/v1/nodes                      this node's cluster membership and controller
//	POST   /api/v1/nodes/self/leave           leave the cluster, then drain
//	POST   /api/v1/nodes/{id}/forget          record a dead node as left
//	GET    /api/v1/moves                      operator moves of queue replicas, with each partition's step
//	POST   /api/v1/moves                      move a queue's replica from one node to another (202)
//	GET    /api/v1/moves/{id}                 one move
//	POST   /api/v1/moves/{id}/cancel          cancel a move that has not cut over
//	POST   /api/v1/moves/unpin                hand a queue an operator moved back to the rebalancer
//	GET    /api/v1/users                      every user with its permissions (never a password or hash)
//	POST   /api/v1/users                      add a user (the password only in the body)
//	GET    /api/v1/users/{name}               one user
//	PUT    /api/v1/users/{name}/password      set its password
//	PUT    /api/v1/users/{name}/permissions   replace its permissions
//	PATCH  /api/v1/users/{name}/permissions   grant and revoke patterns, atomically
//	DELETE /api/v1/users/{name}               remove it
//
// JSON names are snake_case; every JSON error is {"code": ..., "error": ...}.
// A state-changing request a browser marks as cross-site, or whose Origin is
// another host, is refused with 403 forbidden (http.CrossOriginProtection),
// since the dashboard puts this listener in operators' browsers.
//
// Authentication is a Gate wrapped around the handler (auth.go): basic auth
// against the users store or a bearer token from auth.tokens, required
// unless the caller's rule (sinew serve: a loopback listener of a broker
// with no auth configured) admits anonymous requests. /healthz and /readyz
// are always served. Failures wait a fixed delay, are counted and logged
// without the credential; at most authCheckingMax checks run at once. While
// a loopback listener serves requests without credentials, a Host that is
// not a loopback name gets 403 (LoopbackHost), against DNS rebinding.
//
// Recovering is the handler to serve before the broker exists: /healthz 200,
// /readyz 503, the API 503, so probes get an answer during recovery.
//
// The handler holds no state of its own; every request reads the broker, the
// server or the runtime settings store given in Config. It starts no
// goroutines (the caller runs the http.Server). Every wait for the broker is
// bounded by requestTimeoutMs.
//
// Reading messages never leases or settles: it asks the partition's actor to
// walk its state and log between two turns (partition.Peek). A replay publishes
// the copy to its source queue first and removes the dead-letter copy only once
// that publish is confirmed, so a crash in between duplicates, never loses.
// A PUT of the settings is durable when it answers 200: the store persists it
// first.
//
// The metrics exposition is client_golang's promhttp over the Gatherer the
// caller passes; sinew serve's collector reads the broker's and server's
// counters at scrape time.
package admin
