package settings

// help is the one-line meaning of every key. It feeds flag usage and the table in
// docs/configuration.md, which a test keeps in step with Keys.
var help = map[string]string{
	"listen":                   "Address of the client protocol listener (host:port).",
	"admin_listen":             "Address of the admin HTTP server (the dashboard at /, /healthz, /readyz, /metrics and the /api/v1/ API, see docs/operations.md); empty disables it. Open on a loopback address with no auth configured; otherwise requests need HTTP basic auth or a bearer token (auth.tokens), and a non-loopback address without auth configured refuses to start (docs/security.md).",
	"data_dir":                 "Directory holding every queue's log, checkpoints and the broker's owner id. One broker at a time: serve locks it (flock on its LOCK file) before reading it, and a second serve on it exits naming the holder's pid.",
	"log_level":                "debug, info, warn or error.",
	"log_format":               "text (key=value lines) or json (one JSON object per line); both on stderr.",
	"tls.cert_file":            "PEM certificate chain (leaf first) for the client listener. Set together with tls.key_file to serve TLS 1.2+ only.",
	"tls.key_file":             "PEM private key of tls.cert_file's leaf certificate. Refused when group or others may read it (chmod 600).",
	"tls.client_ca_file":       "PEM bundle of the CAs that sign client certificates; set, it turns on mutual TLS on the client listener (docs/security.md).",
	"tls.client_auth":          "With tls.client_ca_file: require (the default: no verified client certificate, no connection) or verify_if_given (a client without one authenticates in HELLO).",
	"tls.client_cert_user":     "cn or san: the verified client certificate's subject common name, or its first DNS name (else e-mail, else URI) SAN, becomes the connection's user (a certificate principal with that user's permissions) unless HELLO names a user or token. Empty: certificates grant no identity.",
	"tls.reload_poll_ms":       "How often the certificate, key and CA files of both listeners are checked for a change and reloaded (new connections get them; open ones carry on). 0: reload only on SIGHUP.",
	"admin_tls.cert_file":      "PEM certificate chain for the admin listener; with admin_tls.key_file the admin API serves HTTPS (TLS 1.2+) only. May name the same files as tls.*.",
	"admin_tls.key_file":       "PEM private key of admin_tls.cert_file's leaf certificate. Refused when group or others may read it (chmod 600).",
	"admin_tls.client_ca_file": "PEM bundle of the CAs that sign admin clients' certificates; set, the admin listener asks for one (admin_tls.client_auth).",
	"admin_tls.client_auth":    "With admin_tls.client_ca_file: require (default) or verify_if_given. HTTP authentication still applies.",
	"auth.tokens":              "Static shared secrets a client may send as its credentials instead of a user name and password; each gives every permission. Each must be 32 to 1024 characters of printable ASCII without spaces (32 hexadecimal digits are 128 bits), or sinew serve refuses to start; sinew auth token generates one. Any token (or any user) makes credentials required on every listener, loopback included. Comma-separated in env and flags.",
	"auth.password_hashes_max": "How many password checks (argon2id hashes, about 30 ms of a core and 19 MiB each) run at once, on both listeners together, 1 to 64. A login waits for a free one at most until its handshake deadline (admin API: 10 s), then gets handshake_timeout (admin API: 429); logins from addresses with a failed check in the last 10 minutes wait behind the others (docs/security.md).",
	"auth.allow_anonymous":     "Accept clients without credentials on every listener, even when users or tokens exist. Without it, only a loopback-only listener of a broker with no users and no tokens accepts them, and a non-loopback listener with no users and no tokens refuses to start. With it, a non-loopback listener logs a warning at startup.",

	"limits.frame_bytes_max":      "Largest frame either side may send, in bytes (at least 65536, at most 1 GiB).",
	"limits.body_bytes_max":       "Largest message body, in bytes; must be below limits.frame_bytes_max.",
	"limits.prefetch_default":     "Prefetch of a subscription that asks for 0.",
	"limits.prefetch_max":         "Largest prefetch per subscription; larger requests are clamped.",
	"limits.settle_batch_max":     "Most tags in one ACK, NACK or FAIL frame.",
	"limits.publish_inflight_max": "Unconfirmed publishes per connection before the server stops reading it.",
	"limits.subscriptions_max":    "Subscriptions per session.",
	"limits.connections_max":      "Open client connections; more are refused with too_many_connections.",
	"limits.queues_max":           "Queues the broker holds; creating more (declared or on first use) is limit_exceeded. Dead-letter queues are exempt and not counted; queues already on disk are all recovered.",
	"limits.queue_partitions_max": "Partitions of one new queue (at most 1024); more is limit_exceeded.",
	"limits.partitions_total_max": "Partitions summed over every queue; a creation that would pass it is limit_exceeded. Dead-letter queues are exempt and not counted.",
	"limits.outbound_bytes_max":   "Bytes queued for one connection's socket (message payloads plus 128 per frame). At the cap the connection's deliveries pause until it has read half; it also caps the pushes a dormant session buffers.",
	"limits.resend_bytes_max":     "Bytes of unsettled deliveries a session keeps to re-send after a resume; deliveries beyond it come back by lease expiry instead.",
	"limits.dormant_sessions_max": "Sessions waiting out their reconnect grace; a disconnect beyond it ends the session at once (a later resume gets resume_not_found).",
	"limits.dedup_producers_max":  "Producers each partition's deduplication window remembers (at most 1,048,576); past it the least recently seen is forgotten, counted in sinew_queue_dedup_evicted_limit_total, and its resends are stored again.",
	"limits.dedup_idle_ms":        "A producer with no publish to a partition for this long is forgotten by its deduplication window (at most a year); its later resends are stored again.",

	// Limits a hostile peer meets first, before its HELLO.
	"limits.connections_per_address_max": "Open client connections from one source IP address; more from that address are refused with too_many_connections while other addresses still connect.",
	"limits.handshakes_max":              "Client connections that have not finished their HELLO (each also bounded by connection.handshake_timeout_ms); one more is refused with too_many_connections and closed at once.",

	"connection.handshake_timeout_ms":     "HELLO (and the TLS handshake) must arrive within this many milliseconds.",
	"connection.heartbeat_ms":             "Idle interval before the server sends PING; three intervals of silence close a connection. 0 disables heartbeats.",
	"connection.write_timeout_ms":         "A write to a client that makes no progress for this long closes the connection.",
	"connection.slow_consumer_timeout_ms": "A connection whose queue stays at limits.outbound_bytes_max this long (its client is not reading) is closed with slow_consumer; its unsettled deliveries go back as for any disconnect.",

	"storage.sync":                     "always: confirm a publish only after its record is fsynced. interval: confirm once written to the OS page cache, fsync every storage.sync_interval_ms.",
	"storage.sync_interval_ms":         "fsync period under storage.sync = interval; a power loss can lose up to this window of confirmed messages.",
	"storage.segment_bytes":            "Size at which a partition log rolls to a new segment file (at least 1 MiB).",
	"storage.quarantine":               "What startup does with a partition whose log or checkpoint fails verification: quarantine, refuse or ignore.",
	"storage.checkpoint_every_records": "Log records a partition appends between checkpoints; fewer means faster recovery and more checkpoint writes.",
	"storage.inbox_max":                "Commands waiting in each partition's inbox before producers wait.",
	"storage.body_cache_bytes":         "Memory budget, for the whole node, of the cache of recently published message bodies that spares consumers a log read; every partition draws on it, and when it is full the partition holding the coldest bodies gives them back. A body leaves it as soon as its message and every older one in the partition are settled. 0 turns the cache off; at most 1 TiB. Shown as budgets.body_cache in /api/v1/overview and sinew_memory_budget_bytes.",
	"storage.raft_cache_bytes":         "Memory budget, for the whole node, of the raft entries kept in memory until applied (and for followers to catch up from); every partition draws on it, and when it is full the partition holding the coldest entries drops them, to be read back from its log if needed. 1 MiB to 1 TiB. Shown as budgets.raft_cache in /api/v1/overview and sinew_memory_budget_bytes.",
	"cluster.enabled":                  "Whether the node joins a cluster: it gets a stable node id in the data directory, gossips on cluster.gossip_listen and joins cluster.seeds. Each queue is replicated over up to three nodes (docs/cluster.md).",
	"cluster.gossip_listen":            "The node's gossip address, UDP and TCP on one port; the host is an IP address, and other nodes list this address in their cluster.seeds.",
	"cluster.seeds":                    "Comma-separated gossip addresses of other nodes, joined at start and again while the node sees no peer alive, while it is fenced, and for a while after it starts. A node started without seeds bootstraps the cluster's controller group on its first start.",
	"cluster.profile":                  "Failure detection timing: seed (a crashed node is declared dead within about 16 s) or lan (within about 1.5 s).",
	"cluster.peer_listen":              "The node's raft transport address (TCP), where the controller group's messages between nodes arrive; every node on one machine needs its own port. Off loopback it requires the cluster.peer_tls_* files.",
	"cluster.peer_tls_cert_file":       "This node's peer certificate (PEM) on the raft transport; it must name this node's id in the URI SAN sinew-node://sinew/<node id> (sinew cert generate --peer-data-dirs makes one per node). With cluster.peer_tls_key_file and cluster.peer_tls_ca_file every peer connection is mutual TLS. Required when cluster.peer_listen is not loopback, and on loopback too when users or auth.tokens are configured.",
	"cluster.peer_tls_key_file":        "The private key (PEM) of cluster.peer_tls_cert_file. Refused when group or others may read it (chmod 600).",
	"cluster.peer_tls_ca_file":         "The peers' CA (PEM): a peer is accepted on the raft transport only with a certificate it issued that names the node the peer speaks as (host names are not checked). Keep it apart from the client CAs: serve warns when it is also tls.client_ca_file or admin_tls.client_ca_file.",
	"cluster.gossip_key_file":          "File holding the gossip key (16, 24 or 32 bytes, base64), which encrypts and authenticates gossip; every node needs the same key. Required when cluster.gossip_listen is not loopback, and on loopback too when users or auth.tokens are configured. Refused when group or others may read it (chmod 600).",
	"storage.wal":                      "Removed: every partition commits through the node journal (DATA_DIR/wal, one fsync stream per node). Accepted only as on, so that older configurations load; off is refused (docs/operations.md, \"Node journal\").",

	"queue.partitions":        "Partitions of a queue created on first use.",
	"queue.lease_ms":          "How long a manual-ack delivery stays leased before it is delivered again (queues created on first use).",
	"queue.max_retries":       "Redeliveries after a failed delivery (a NACK, or a lease expiring while its holder is connected; a consumer going away does not count) before a message is dead-lettered with reason retries_exhausted.",
	"queue.dead_letter_topic": "Queue that receives failed, exhausted and expired messages. It keeps them: no retry limit, no TTL, FAIL requeues.",
	"queue.delay_ms_max":      "Longest delay a publish may ask for (delay_ms, or not_before_ms from now); beyond it the publish is refused with bad_request.",
	"queue.ttl_ms_max":        "Longest TTL a publish (ttl_ms) or a queue declaration (default_ttl_ms) may ask for; beyond it the request is refused with bad_request.",
	"queue.nack_delay_ms_max": "Longest delay a NACK (retry after) may ask for; beyond it the NACK is refused with bad_request and the lease stays held.",
	"queue.lease_ms_max":      "Longest extension an EXTEND may ask for (extend_ms: the lease's new deadline is now plus it); beyond it, or below 1, the EXTEND is refused with bad_request and the lease is unchanged. At most a week.",

	"runtime_seed.connection.restart_grace_ms":   "Seed of the runtime setting connection.restart_grace_ms (how long after a restart the previous process's sessions stay resumable and keep their leases; 0 restores none), used only when the data directory has no runtime settings yet. Change it later with PUT /api/v1/settings.",
	"runtime_seed.connection.drain_timeout_ms":   "Seed of the runtime setting connection.drain_timeout_ms (how long the first phase of a planned drain lets work in flight finish before connections close; it ends earlier once nothing is in flight), used only when the data directory has no runtime settings yet. Change it later with PUT /api/v1/settings.",
	"runtime_seed.connection.reconnect_grace_ms": "Seed of the runtime setting connection.reconnect_grace_ms (how long a dropped session stays resumable; 0 cleans it up at once), used only when the data directory has no runtime settings yet. Change it later with PUT /api/v1/settings.",

	"metrics.queue_depth": "on or off: whether /metrics serves the per-partition queue gauges (sinew_queue_*, labelled by topic, group and partition). Turn it off when many queues make scrapes large.",
}

// Describe returns the meaning of key, or "" for an unknown key.
func Describe(key string) string { return help[key] }
