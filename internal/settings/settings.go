package settings

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/runtimesettings"
)

// Config is the startup configuration. The toml tags are the keys.
type Config struct {
	// Listen is the client protocol address.
	Listen string `toml:"listen"`
	// AdminListen is the HTTP address for health, metrics and stats; empty disables it.
	AdminListen string `toml:"admin_listen"`
	// DataDir holds every queue's log and the broker's identity.
	DataDir string `toml:"data_dir"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `toml:"log_level"`
	// LogFormat is text or json.
	LogFormat string `toml:"log_format"`

	TLS        TLS        `toml:"tls"`
	AdminTLS   AdminTLS   `toml:"admin_tls"`
	Auth       Auth       `toml:"auth"`
	Limits     Limits     `toml:"limits"`
	Connection Connection `toml:"connection"`
	Storage    Storage    `toml:"storage"`
	Queue      Queue      `toml:"queue"`
	Metrics    Metrics    `toml:"metrics"`
	Cluster    Cluster    `toml:"cluster"`

	// RuntimeSeed seeds the runtime settings document of a data directory
	// that has none yet; see RuntimeSeed.
	RuntimeSeed RuntimeSeed `toml:"runtime_seed"`
}

// RuntimeSeed holds the first values of the runtime settings
// (internal/runtimesettings). They are used once, when the data directory has
// no runtime settings document; after that the document wins and changes go
// through the admin API. Each key under runtime_seed is the runtime setting of
// the same name.
type RuntimeSeed struct {
	Connection RuntimeSeedConnection `toml:"connection"`
}

// RuntimeSeedConnection seeds the connection runtime settings.
type RuntimeSeedConnection struct {
	ReconnectGraceMs int64 `toml:"reconnect_grace_ms"`
	RestartGraceMs   int64 `toml:"restart_grace_ms"`
	DrainTimeoutMs   int64 `toml:"drain_timeout_ms"`
}

// runtimeSeedPrefix starts every key of the runtime_seed section.
const runtimeSeedPrefix = "runtime_seed."

// Seed returns the runtime_seed section as runtime setting names and values.
func (c *Config) Seed() map[string]int64 {
	out := map[string]int64{}
	for _, f := range fields(c) {
		if name, ok := strings.CutPrefix(f.key, runtimeSeedPrefix); ok {
			out[name] = f.v.Int()
		}
	}
	return out
}

// TLS configures the client listener's TLS. With both files set the listener
// speaks only TLS; with neither, plain TCP.
type TLS struct {
	// CertFile is a PEM certificate chain, leaf first.
	CertFile string `toml:"cert_file"`
	// KeyFile is the PEM private key of the leaf certificate.
	KeyFile string `toml:"key_file"`
	// ClientCAFile, when set, turns on mutual TLS: client certificates
	// must chain to one of its CAs. ClientAuth is "require" (the default
	// with a CA) or "verify_if_given".
	ClientCAFile string `toml:"client_ca_file"`
	ClientAuth   string `toml:"client_auth"`
	// ClientCertUser names the connection's user after its verified
	// client certificate: "cn", "san", or "" (off).
	ClientCertUser string `toml:"client_cert_user"`
	// ReloadPollMs is how often both listeners' files are checked for a
	// change (0: only on SIGHUP).
	ReloadPollMs int64 `toml:"reload_poll_ms"`
}

// Enabled reports whether the client listener uses TLS.
func (t TLS) Enabled() bool { return t.CertFile != "" && t.KeyFile != "" }

// AdminTLS configures the admin listener's TLS (HTTPS), independently of
// the client listener's: the same files may be named in both.
type AdminTLS struct {
	CertFile     string `toml:"cert_file"`
	KeyFile      string `toml:"key_file"`
	ClientCAFile string `toml:"client_ca_file"`
	ClientAuth   string `toml:"client_auth"`
}

// Enabled reports whether the admin listener uses TLS.
func (t AdminTLS) Enabled() bool { return t.CertFile != "" && t.KeyFile != "" }

// Auth configures client authentication.
type Auth struct {
	// Tokens are static shared secrets a HELLO may carry instead of a user
	// name and password; each gives every permission.
	Tokens []string `toml:"tokens"`
	// AllowAnonymous accepts clients without credentials on any listener,
	// even when users or tokens exist. Without it, only a loopback-only
	// listener with no authentication configured accepts them, and a
	// non-loopback listener without authentication refuses to start.
	AllowAnonymous bool `toml:"allow_anonymous"`
	// PasswordHashesMax is how many password hashes run at once, on both
	// listeners together: each takes a core and 19 MiB for about 30 ms.
	PasswordHashesMax int `toml:"password_hashes_max"`
}

// Limits bound what one client can ask of the broker.
type Limits struct {
	FrameBytesMax      int `toml:"frame_bytes_max"`
	BodyBytesMax       int `toml:"body_bytes_max"`
	PrefetchDefault    int `toml:"prefetch_default"`
	PrefetchMax        int `toml:"prefetch_max"`
	SettleBatchMax     int `toml:"settle_batch_max"`
	PublishInflightMax int `toml:"publish_inflight_max"`
	SubscriptionsMax   int `toml:"subscriptions_max"`
	ConnectionsMax     int `toml:"connections_max"`
	// ConnectionsPerAddressMax caps the open connections from one source
	// IP address; HandshakesMax caps the connections that have not finished
	// their HELLO.
	ConnectionsPerAddressMax int `toml:"connections_per_address_max"`
	HandshakesMax            int `toml:"handshakes_max"`
	// QueuesMax, QueuePartitionsMax and PartitionsTotalMax bound queue
	// creation, declared or on first use.
	QueuesMax          int `toml:"queues_max"`
	QueuePartitionsMax int `toml:"queue_partitions_max"`
	PartitionsTotalMax int `toml:"partitions_total_max"`
	// OutboundBytesMax caps the bytes queued for one connection's socket (and
	// a dormant session's buffer); at the cap its deliveries pause.
	OutboundBytesMax int64 `toml:"outbound_bytes_max"`
	// ResendBytesMax caps the unsettled deliveries a session keeps for
	// re-sending after a resume.
	ResendBytesMax int64 `toml:"resend_bytes_max"`
	// DormantSessionsMax caps the sessions waiting out their reconnect grace.
	DormantSessionsMax int `toml:"dormant_sessions_max"`
	// DedupProducersMax and DedupIdleMs bound each partition's producer
	// deduplication window: producers remembered, and how long one is
	// remembered after its last publish.
	DedupProducersMax int   `toml:"dedup_producers_max"`
	DedupIdleMs       int64 `toml:"dedup_idle_ms"`
}

// Connection configures timeouts and the session grace.
type Connection struct {
	HandshakeTimeoutMs int64 `toml:"handshake_timeout_ms"`
	// HeartbeatMs is the idle interval before the server PINGs; three intervals of
	// silence close a connection. 0 disables heartbeats.
	HeartbeatMs    int64 `toml:"heartbeat_ms"`
	WriteTimeoutMs int64 `toml:"write_timeout_ms"`
	// SlowConsumerTimeoutMs is how long a connection may stay at
	// limits.outbound_bytes_max before it is closed with slow_consumer.
	SlowConsumerTimeoutMs int64 `toml:"slow_consumer_timeout_ms"`
}

// Storage configures the logs.
type Storage struct {
	// Sync is "always" (confirm after fsync, the default) or "interval" (confirm
	// after write; fsync every SyncIntervalMs: power loss can lose that window).
	Sync                   string `toml:"sync"`
	SyncIntervalMs         int    `toml:"sync_interval_ms"`
	SegmentBytes           int64  `toml:"segment_bytes"`
	Quarantine             string `toml:"quarantine"` // quarantine | refuse | ignore
	CheckpointEveryRecords int    `toml:"checkpoint_every_records"`
	InboxMax               int    `toml:"inbox_max"`
	// WAL is on or off: whether every partition's entries are made durable
	// through one node write-ahead log (DataDir/wal) instead of each
	// partition's own fsync.
	WAL string `toml:"wal"`
}

// Cluster configures the node's membership in a cluster (internal/membership).
type Cluster struct {
	// Enabled starts the node's membership: its stable node id, gossip on
	// GossipListen, and a join through Seeds.
	Enabled bool `toml:"enabled"`
	// GossipListen is the gossip address (UDP and TCP on the same port); its
	// host must be an IP address, and other nodes list it in their seeds.
	GossipListen string `toml:"gossip_listen"`
	// Seeds are other nodes' gossip addresses, joined at start and rejoined
	// while this node is fenced.
	Seeds []string `toml:"seeds"`
	// Profile is the failure detector's timing: seed (the default, a crashed
	// node is declared dead within about 16 s of its first failed probe) or
	// lan (within about 1.5 s).
	Profile string `toml:"profile"`
	// GossipKeyFile holds the key that encrypts and authenticates gossip
	// (16, 24 or 32 bytes, base64); required when GossipListen is not
	// loopback.
	GossipKeyFile string `toml:"gossip_key_file"`
	// PeerListen is the raft transport's address (TCP): the controller
	// group's messages between nodes travel there. Off loopback it needs
	// the peer TLS files below.
	PeerListen string `toml:"peer_listen"`
	// PeerTLSCertFile and PeerTLSKeyFile are this node's certificate and
	// key on the raft transport, and PeerTLSCAFile the peers' CA: with
	// them every peer connection is mutual TLS, and a peer is accepted
	// only with a certificate that CA issued naming the node it speaks as
	// (URI SAN sinew-node://sinew/<node id>). serve requires them, and
	// GossipKeyFile, on loopback too once users or tokens exist.
	PeerTLSCertFile string `toml:"peer_tls_cert_file"`
	PeerTLSKeyFile  string `toml:"peer_tls_key_file"`
	PeerTLSCAFile   string `toml:"peer_tls_ca_file"`
}

// Metrics shapes what /metrics serves.
type Metrics struct {
	// QueueDepth is on or off: whether the per-partition queue gauges
	// (sinew_queue_*) are served. Off keeps a broker with many queues
	// cheap to scrape.
	QueueDepth string `toml:"queue_depth"`
}

// Queue holds the defaults of queues created on first use.
type Queue struct {
	Partitions      int    `toml:"partitions"`
	LeaseMs         int64  `toml:"lease_ms"`
	MaxRetries      int    `toml:"max_retries"`
	DeadLetterTopic string `toml:"dead_letter_topic"`
	// Caps on scheduling into the future, for every queue.
	DelayMsMax     int64 `toml:"delay_ms_max"`
	TTLMsMax       int64 `toml:"ttl_ms_max"`
	NackDelayMsMax int64 `toml:"nack_delay_ms_max"`
	// LeaseMsMax bounds one EXTEND: a lease's new deadline is at most this
	// far from now.
	LeaseMsMax int64 `toml:"lease_ms_max"`
}

// Scheduling caps: 30 days by default; at most 100 years, so now plus a cap
// stays far from overflow (the broker's TimeCapMsMax).
const (
	thirtyDaysMs  = 30 * 24 * 3600 * 1000
	twelveHoursMs = 12 * 3600 * 1000
	// leaseMsMaxMax bounds queue.lease_ms_max: a week, the longest lease
	// a queue holds.
	leaseMsMaxMax = 7 * 24 * 3600 * 1000
	timeCapMsMax  = 100 * 365 * 24 * 3600 * 1000
)

// Default returns the built-in configuration.
func Default() Config {
	return Config{
		Listen: "127.0.0.1:7654", AdminListen: "127.0.0.1:7655", DataDir: "./sinew-data", LogLevel: "info", LogFormat: "text",
		Metrics: Metrics{QueueDepth: "on"},
		Auth:    Auth{PasswordHashesMax: auth.HashesMaxDefault},
		TLS:     TLS{ReloadPollMs: 5000},
		Limits: Limits{
			FrameBytesMax: 1<<20 + 64<<10, BodyBytesMax: 1 << 20, PrefetchDefault: 100, PrefetchMax: 10_000,
			SettleBatchMax: 4096, PublishInflightMax: 4096, SubscriptionsMax: 256, ConnectionsMax: 10_000,
			ConnectionsPerAddressMax: 1000, HandshakesMax: 1000,
			QueuesMax: 1000, QueuePartitionsMax: 64, PartitionsTotalMax: 4096,
			OutboundBytesMax: 1 << 20, ResendBytesMax: 1 << 20, DormantSessionsMax: 10_000,
			DedupProducersMax: 1024, DedupIdleMs: 24 * 3600 * 1000,
		},
		Connection: Connection{HandshakeTimeoutMs: 10_000, HeartbeatMs: 10_000, WriteTimeoutMs: 30_000,
			SlowConsumerTimeoutMs: 30_000},
		Cluster: Cluster{GossipListen: "127.0.0.1:7946", PeerListen: "127.0.0.1:7947", Profile: "seed"},
		Storage: Storage{Sync: "always", SyncIntervalMs: 100, SegmentBytes: 64 << 20, Quarantine: "quarantine", CheckpointEveryRecords: 100_000, InboxMax: 4096, WAL: "off"},
		Queue: Queue{Partitions: 1, LeaseMs: 30_000, MaxRetries: 5, DeadLetterTopic: "sinew.dead-letter",
			DelayMsMax: thirtyDaysMs, TTLMsMax: thirtyDaysMs, NackDelayMsMax: thirtyDaysMs,
			LeaseMsMax: twelveHoursMs},
		// sinew serve keeps dropped sessions resumable for 5 s by default;
		// the broker library's own default stays 0.
		RuntimeSeed: RuntimeSeed{Connection: RuntimeSeedConnection{ReconnectGraceMs: 5000, RestartGraceMs: 30_000, DrainTimeoutMs: 10_000}},
	}
}

// movedKeys are startup keys that became runtime settings. Naming one in any
// source is an error that says where the setting lives now, rather than the
// bare "unknown key" (or, for an environment variable, nothing at all).
var movedKeys = map[string]string{
	"connection.reconnect_grace_ms": "runtime_seed.connection.reconnect_grace_ms",
	"connection.drain_timeout_ms":   "runtime_seed.connection.drain_timeout_ms",
}

func movedKeyError(key string) error {
	return fmt.Errorf("%s is now a runtime setting: set %s (used only while the data directory has no runtime settings yet) "+
		"or change it on a running broker with PUT /api/v1/settings", key, movedKeys[key])
}

// field is one settable key.
type field struct {
	key string // TOML path, e.g. "limits.frame_bytes_max"
	v   reflect.Value
}

// EnvName is the environment variable of key.
func EnvName(key string) string {
	return "SINEW_" + strings.ToUpper(strings.NewReplacer(".", "_").Replace(key))
}

// FlagName is the flag of key.
func FlagName(key string) string { return strings.NewReplacer(".", "-", "_", "-").Replace(key) }

// fields lists every key of c, addressable for setting.
func fields(c *Config) []field {
	var out []field
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		t := v.Type()
		for i := range t.NumField() {
			name := t.Field(i).Tag.Get("toml")
			if name == "" || name == "-" {
				continue
			}
			fv := v.Field(i)
			if fv.Kind() == reflect.Struct {
				walk(prefix+name+".", fv)
				continue
			}
			out = append(out, field{key: prefix + name, v: fv})
		}
	}
	walk("", reflect.ValueOf(c).Elem())
	return out
}

// Keys returns every configuration key in declaration order.
func Keys() []string {
	var c Config
	var keys []string
	for _, f := range fields(&c) {
		keys = append(keys, f.key)
	}
	return keys
}

func set(f field, s string) error {
	switch f.v.Kind() {
	case reflect.String:
		f.v.SetString(s)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %q is not an integer", f.key, s)
		}
		f.v.SetInt(n)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("%s: %q is not true or false", f.key, s)
		}
		f.v.SetBool(b)
	case reflect.Slice:
		var items []string
		for p := range strings.SplitSeq(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				items = append(items, p)
			}
		}
		f.v.Set(reflect.ValueOf(items))
	default:
		panic("settings: unsupported field kind " + f.v.Kind().String()) // a Config change broke the table
	}
	return nil
}

func get(f field) string {
	if f.v.Kind() == reflect.Slice {
		return strings.Join(f.v.Interface().([]string), ",")
	}
	return fmt.Sprint(f.v.Interface())
}

// Sources says where Load reads from.
type Sources struct {
	// File is the TOML file; empty means none.
	File string
	// Env looks up environment variables (os.LookupEnv in production).
	Env func(string) (string, bool)
	// Flags is a parsed flag set made by RegisterFlags; only flags that were set
	// on the command line apply.
	Flags *flag.FlagSet
}

// flagUsagePrefix marks the flags RegisterFlags defines, so Load can tell them
// from a command's other flags; movedUsagePrefix marks the flags of movedKeys.
const (
	flagUsagePrefix  = "config key "
	movedUsagePrefix = "moved config key "
)

// RegisterFlags defines one string flag per key on fs. Values are parsed by Load,
// so that errors name the key the same way for every source.
func RegisterFlags(fs *flag.FlagSet) {
	d := Default()
	for _, f := range fields(&d) {
		usage := flagUsagePrefix + f.key + " (env " + EnvName(f.key) + "): " + Describe(f.key)
		if f.v.Kind() == reflect.Bool {
			// A boolean flag works bare (--auth-allow-anonymous) as
			// well as with a value.
			fs.Bool(FlagName(f.key), f.v.Bool(), usage)
			continue
		}
		fs.String(FlagName(f.key), get(f), usage)
	}
	for old, now := range movedKeys {
		fs.String(FlagName(old), "", movedUsagePrefix+old+": replaced by --"+FlagName(now)+" and the admin API")
	}
}

// Load builds the configuration from defaults, then the file, then the
// environment, then flags, and validates the result.
func Load(src Sources) (Config, error) {
	c := Default()
	if src.File != "" {
		data, err := os.ReadFile(src.File)
		if err != nil {
			return c, fmt.Errorf("settings: %w", err)
		}
		if err := decodeFile(&c, data); err != nil {
			return c, fmt.Errorf("settings: %s: %w", src.File, err)
		}
	}
	fs := fields(&c)
	if src.Env != nil {
		for old := range movedKeys {
			if _, ok := src.Env(EnvName(old)); ok {
				return c, fmt.Errorf("settings: env %s: %w", EnvName(old), movedKeyError(old))
			}
		}
		for _, f := range fs {
			if s, ok := src.Env(EnvName(f.key)); ok {
				if err := set(f, s); err != nil {
					return c, fmt.Errorf("settings: env %s: %w", EnvName(f.key), err)
				}
			}
		}
	}
	if src.Flags != nil {
		byFlag := make(map[string]field, len(fs))
		for _, f := range fs {
			byFlag[FlagName(f.key)] = f
		}
		var err error
		src.Flags.Visit(func(fl *flag.Flag) {
			if err == nil && strings.HasPrefix(fl.Usage, movedUsagePrefix) {
				for old := range movedKeys {
					if FlagName(old) == fl.Name {
						err = fmt.Errorf("settings: flag --%s: %w", fl.Name, movedKeyError(old))
					}
				}
				return
			}
			f, ok := byFlag[fl.Name]
			if !ok || err != nil || !strings.HasPrefix(fl.Usage, flagUsagePrefix) {
				return
			}
			if e := set(f, fl.Value.String()); e != nil {
				err = fmt.Errorf("settings: flag --%s: %w", fl.Name, e)
			}
		})
		if err != nil {
			return c, err
		}
	}
	return c, c.Validate()
}

func decodeFile(c *Config, data []byte) error {
	d := toml.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	err := d.Decode(c)
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var keys []string
		for _, e := range strict.Errors {
			k := strings.Join(e.Key(), ".")
			if _, moved := movedKeys[k]; moved {
				return movedKeyError(k)
			}
			keys = append(keys, k)
		}
		return fmt.Errorf("unknown key %s", strings.Join(keys, ", "))
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		return fmt.Errorf("line %d column %d: %s", row, col, de.Error())
	}
	return err
}

// validateTLS checks both listeners' TLS keys: files in pairs, mutual TLS
// only with TLS on and a client CA, and known policy names.
func (c *Config) validateTLS(bad func(key, format string, args ...any)) {
	type section struct {
		name                          string
		cert, key, ca, auth, certUser string
	}
	for _, t := range []section{
		{"tls", c.TLS.CertFile, c.TLS.KeyFile, c.TLS.ClientCAFile, c.TLS.ClientAuth, c.TLS.ClientCertUser},
		{"admin_tls", c.AdminTLS.CertFile, c.AdminTLS.KeyFile, c.AdminTLS.ClientCAFile, c.AdminTLS.ClientAuth, ""},
	} {
		switch {
		case t.cert != "" && t.key == "":
			bad(t.name+".key_file", "must be set together with %s.cert_file", t.name)
		case t.cert == "" && t.key != "":
			bad(t.name+".cert_file", "must be set together with %s.key_file", t.name)
		}
		if t.ca != "" && t.cert == "" {
			bad(t.name+".client_ca_file", "needs %s.cert_file and %s.key_file: mutual TLS is TLS", t.name, t.name)
		}
		switch t.auth {
		case "":
		case "require", "verify_if_given":
			if t.ca == "" {
				bad(t.name+".client_auth", "needs %s.client_ca_file", t.name)
			}
		default:
			bad(t.name+".client_auth", "%q is not require or verify_if_given", t.auth)
		}
		switch t.certUser {
		case "":
		case "cn", "san":
			if t.ca == "" {
				bad(t.name+".client_cert_user", "needs %s.client_ca_file", t.name)
			}
		default:
			bad(t.name+".client_cert_user", "%q is not cn or san", t.certUser)
		}
	}
	if p := c.TLS.ReloadPollMs; p != 0 && (p < 100 || p > 24*3600*1000) {
		bad("tls.reload_poll_ms", "%d: want 0 (off) or 100 to 86400000", p)
	}
}

// Validate reports every invalid value, each naming its key.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("settings: %s: %s", key, fmt.Sprintf(format, args...)))
	}
	addr := func(key, v string, emptyOK bool) {
		if v == "" {
			if !emptyOK {
				bad(key, "must not be empty")
			}
			return
		}
		if _, port, err := net.SplitHostPort(v); err != nil {
			bad(key, "%q is not host:port", v)
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			bad(key, "%q: the port must be a number from 0 to 65535", v)
		}
	}
	addr("listen", c.Listen, false)
	addr("admin_listen", c.AdminListen, true)
	if c.DataDir == "" {
		bad("data_dir", "must not be empty")
	}
	c.validateTLS(bad)
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level", "%q is not debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("log_format", "%q is not text or json", c.LogFormat)
	}
	if c.Metrics.QueueDepth != "on" && c.Metrics.QueueDepth != "off" {
		bad("metrics.queue_depth", "%q is not on or off", c.Metrics.QueueDepth)
	}
	for i, t := range c.Auth.Tokens {
		// Named by position (1-based, as in token#N), never by value: the
		// message goes to the terminal and to logs.
		if err := auth.CheckToken(t); err != nil {
			bad("auth.tokens", "token %d of %d: %v; %s", i+1, len(c.Auth.Tokens), err, auth.TokenGenerateHint)
		}
	}
	if n := c.Auth.PasswordHashesMax; n < 1 || n > auth.HashesMaxLimit {
		bad("auth.password_hashes_max", "%d is not 1 to %d", n, auth.HashesMaxLimit)
	}
	l := c.Limits
	positive := func(key string, v int64) {
		if v <= 0 {
			bad(key, "must be positive, got %d", v)
		}
	}
	positive("limits.frame_bytes_max", int64(l.FrameBytesMax))
	positive("limits.body_bytes_max", int64(l.BodyBytesMax))
	positive("limits.prefetch_default", int64(l.PrefetchDefault))
	positive("limits.prefetch_max", int64(l.PrefetchMax))
	positive("limits.settle_batch_max", int64(l.SettleBatchMax))
	positive("limits.publish_inflight_max", int64(l.PublishInflightMax))
	positive("limits.subscriptions_max", int64(l.SubscriptionsMax))
	positive("limits.connections_max", int64(l.ConnectionsMax))
	positive("limits.connections_per_address_max", int64(l.ConnectionsPerAddressMax))
	positive("limits.handshakes_max", int64(l.HandshakesMax))
	positive("limits.outbound_bytes_max", l.OutboundBytesMax)
	positive("limits.resend_bytes_max", l.ResendBytesMax)
	positive("limits.dormant_sessions_max", int64(l.DormantSessionsMax))
	positive("limits.dedup_producers_max", int64(l.DedupProducersMax))
	positive("limits.dedup_idle_ms", l.DedupIdleMs)
	if l.FrameBytesMax > 0 && l.FrameBytesMax < 64<<10 {
		bad("limits.frame_bytes_max", "%d is below the protocol minimum %d", l.FrameBytesMax, 64<<10)
	}
	if l.FrameBytesMax > 1<<30 {
		bad("limits.frame_bytes_max", "%d is above 1 GiB", l.FrameBytesMax)
	}
	if l.BodyBytesMax >= l.FrameBytesMax {
		bad("limits.body_bytes_max", "%d must be below limits.frame_bytes_max %d", l.BodyBytesMax, l.FrameBytesMax)
	}
	if l.PrefetchDefault > l.PrefetchMax {
		bad("limits.prefetch_default", "%d exceeds limits.prefetch_max %d", l.PrefetchDefault, l.PrefetchMax)
	}
	if l.PrefetchMax > 1<<20 {
		bad("limits.prefetch_max", "%d is above %d", l.PrefetchMax, 1<<20)
	}
	positive("limits.queues_max", int64(l.QueuesMax))
	positive("limits.queue_partitions_max", int64(l.QueuePartitionsMax))
	positive("limits.partitions_total_max", int64(l.PartitionsTotalMax))
	if l.QueuePartitionsMax > 1024 {
		bad("limits.queue_partitions_max", "%d is above the broker's hard limit 1024", l.QueuePartitionsMax)
	}
	if c.Queue.Partitions > l.QueuePartitionsMax && l.QueuePartitionsMax > 0 {
		bad("queue.partitions", "%d exceeds limits.queue_partitions_max %d", c.Queue.Partitions, l.QueuePartitionsMax)
	}
	if l.SettleBatchMax > 1<<16 {
		bad("limits.settle_batch_max", "%d is above the protocol's list limit %d", l.SettleBatchMax, 1<<16)
	}
	cn := c.Connection
	positive("connection.handshake_timeout_ms", cn.HandshakeTimeoutMs)
	positive("connection.write_timeout_ms", cn.WriteTimeoutMs)
	positive("connection.slow_consumer_timeout_ms", cn.SlowConsumerTimeoutMs)
	if cn.HeartbeatMs < 0 || cn.HeartbeatMs > 1<<31 {
		bad("connection.heartbeat_ms", "%d is out of range 0..%d", cn.HeartbeatMs, int64(1)<<31)
	}
	for name, v := range c.Seed() {
		if err := runtimesettings.Check(name, v); err != nil {
			bad(runtimeSeedPrefix+name, "%s", strings.TrimPrefix(err.Error(), name+": "))
		}
	}
	// Upper bounds where a value would not fit where it goes: milliseconds
	// become time.Durations (int64 nanoseconds, which wrap above ~292
	// years); publish_inflight_max and subscriptions_max are 32-bit fields
	// in HELLO_OK; inbox_max sizes a channel allocated per partition;
	// max_retries is capped by the queue at queue.MaxRetriesMax.
	for _, b := range []struct {
		key   string
		v, hi int64
	}{
		{"connection.handshake_timeout_ms", cn.HandshakeTimeoutMs, 1 << 31},
		{"connection.write_timeout_ms", cn.WriteTimeoutMs, 1 << 31},
		{"storage.sync_interval_ms", int64(c.Storage.SyncIntervalMs), 1 << 31},
		{"queue.lease_ms", c.Queue.LeaseMs, 1 << 31},
		{"connection.slow_consumer_timeout_ms", cn.SlowConsumerTimeoutMs, 1 << 31},
		{"storage.inbox_max", int64(c.Storage.InboxMax), 1 << 16},
		{"storage.segment_bytes", c.Storage.SegmentBytes, 1 << 40},
		{"queue.max_retries", int64(c.Queue.MaxRetries), queue.MaxRetriesMax},
		{"limits.publish_inflight_max", int64(l.PublishInflightMax), 1 << 20},
		{"limits.subscriptions_max", int64(l.SubscriptionsMax), 1 << 20},
		{"limits.dedup_producers_max", int64(l.DedupProducersMax), 1 << 20},
		{"limits.dedup_idle_ms", l.DedupIdleMs, 365 * 24 * 3600 * 1000},
	} {
		if b.v > b.hi {
			bad(b.key, "%d is above %d", b.v, b.hi)
		}
	}
	s := c.Storage
	switch s.Sync {
	case "always", "interval":
	default:
		bad("storage.sync", "%q is not always or interval", s.Sync)
	}
	if s.Sync == "interval" {
		positive("storage.sync_interval_ms", int64(s.SyncIntervalMs))
	}
	if s.SegmentBytes < 1<<20 {
		bad("storage.segment_bytes", "%d is below 1 MiB", s.SegmentBytes)
	}
	switch s.Quarantine {
	case "quarantine", "refuse", "ignore":
	default:
		bad("storage.quarantine", "%q is not quarantine, refuse or ignore", s.Quarantine)
	}
	positive("storage.checkpoint_every_records", int64(s.CheckpointEveryRecords))
	positive("storage.inbox_max", int64(s.InboxMax))
	if s.WAL != "on" && s.WAL != "off" {
		bad("storage.wal", "%q is not on or off", s.WAL)
	}
	c.validateCluster(bad)
	q := c.Queue
	if q.Partitions <= 0 || q.Partitions > 1024 {
		bad("queue.partitions", "%d is out of range 1..1024", q.Partitions)
	}
	positive("queue.lease_ms", q.LeaseMs)
	if q.MaxRetries < 0 {
		bad("queue.max_retries", "must not be negative, got %d", q.MaxRetries)
	}
	if q.DeadLetterTopic == "" {
		bad("queue.dead_letter_topic", "must not be empty")
	}
	for _, c := range []struct {
		key string
		v   int64
	}{{"queue.delay_ms_max", q.DelayMsMax}, {"queue.ttl_ms_max", q.TTLMsMax}, {"queue.nack_delay_ms_max", q.NackDelayMsMax}} {
		if c.v <= 0 || c.v > timeCapMsMax {
			bad(c.key, "%d is out of range 1..%d", c.v, int64(timeCapMsMax))
		}
	}
	if q.LeaseMsMax <= 0 || q.LeaseMsMax > leaseMsMaxMax {
		bad("queue.lease_ms_max", "%d is out of range 1..%d (a week)", q.LeaseMsMax, int64(leaseMsMaxMax))
	}
	return errors.Join(errs...)
}

func (c *Config) validateCluster(bad func(key, format string, args ...any)) {
	cl := c.Cluster
	if cl.Enabled && c.Storage.WAL == "on" {
		bad("storage.wal", "on is not supported with cluster.enabled yet: replicated partitions write their own logs (docs/cluster.md)")
	}
	host, _, err := net.SplitHostPort(cl.GossipListen)
	ip := net.ParseIP(host)
	switch {
	case err != nil:
		bad("cluster.gossip_listen", "%q is not host:port", cl.GossipListen)
	case ip == nil:
		bad("cluster.gossip_listen", "%q: the host must be an IP address", cl.GossipListen)
	case cl.Enabled && !ip.IsLoopback() && cl.GossipKeyFile == "":
		bad("cluster.gossip_key_file", "required when cluster.gossip_listen %q is not loopback: without a key anyone who reaches the port can join the cluster", cl.GossipListen)
	}
	for _, sd := range cl.Seeds {
		if _, _, err := net.SplitHostPort(sd); err != nil {
			bad("cluster.seeds", "%q is not host:port", sd)
		}
	}
	phost, _, err := net.SplitHostPort(cl.PeerListen)
	pip := net.ParseIP(phost)
	switch {
	case err != nil:
		bad("cluster.peer_listen", "%q is not host:port", cl.PeerListen)
	case pip == nil:
		bad("cluster.peer_listen", "%q: the host must be an IP address", cl.PeerListen)
	case pip.IsUnspecified():
		bad("cluster.peer_listen", "%q: the host must be this node's own address, which the other nodes dial (it is advertised to them), not an unspecified one", cl.PeerListen)
	case cl.Enabled && !pip.IsLoopback() && cl.PeerTLSCertFile == "":
		bad("cluster.peer_tls_cert_file", "required when cluster.peer_listen %q is not loopback: without peer TLS anyone who reaches the port could send raft messages (docs/cluster.md)", cl.PeerListen)
	}
	if n := countSet(cl.PeerTLSCertFile, cl.PeerTLSKeyFile, cl.PeerTLSCAFile); n != 0 && n != 3 {
		bad("cluster.peer_tls_cert_file", "cluster.peer_tls_cert_file, cluster.peer_tls_key_file and cluster.peer_tls_ca_file go together: set all three or none")
	}
	if cl.Profile != "seed" && cl.Profile != "lan" {
		bad("cluster.profile", "%q is not seed or lan", cl.Profile)
	}
}

// countSet counts the non-empty strings.
func countSet(ss ...string) int {
	n := 0
	for _, s := range ss {
		if s != "" {
			n++
		}
	}
	return n
}
