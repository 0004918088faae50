package settings

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/runtimesettings"
)

func write(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sinew.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaultsValidate(t *testing.T) {
	c, err := Load(Sources{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:7654" || c.AdminListen != "127.0.0.1:7655" || c.DataDir != "./sinew-data" ||
		c.Storage.Sync != "always" || c.RuntimeSeed.Connection.ReconnectGraceMs != 5000 {
		t.Fatalf("defaults %+v", c)
	}
}

func TestPrecedence(t *testing.T) {
	file := write(t, `
listen = "127.0.0.1:1000"
data_dir = "/from-file"

[auth]
tokens = ["aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"]

[limits]
prefetch_max = 500

[connection]
heartbeat_ms = 3000

[runtime_seed.connection]
reconnect_grace_ms = 2000

[storage]
sync = "interval"
sync_interval_ms = 50
quarantine = "refuse"

[queue]
partitions = 4
`)
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	RegisterFlags(fs)
	fs.Int("unrelated", 0, "a command flag that is not a key")
	if err := fs.Parse([]string{"--data-dir", "/from-flag", "--connection-heartbeat-ms=7000", "--unrelated=3"}); err != nil {
		t.Fatal(err)
	}
	c, err := Load(Sources{File: file, Flags: fs, Env: env(map[string]string{
		"SINEW_DATA_DIR":                                   "/from-env",
		"SINEW_LIMITS_PREFETCH_MAX":                        "600",
		"SINEW_CONNECTION_HEARTBEAT_MS":                    "5000",
		"SINEW_AUTH_TOKENS":                                "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx, yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy",
		"SINEW_RUNTIME_SEED_CONNECTION_RECONNECT_GRACE_MS": "1_500",
	})})
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		key       string
		got, want any
	}{
		{"listen (file)", c.Listen, "127.0.0.1:1000"},
		{"data_dir (flag over env over file)", c.DataDir, "/from-flag"},
		{"heartbeat (flag)", c.Connection.HeartbeatMs, int64(7000)},
		{"prefetch_max (env over file)", c.Limits.PrefetchMax, 600},
		{"tokens (env)", strings.Join(c.Auth.Tokens, "|"), "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx|yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy"},
		{"grace seed (env)", c.RuntimeSeed.Connection.ReconnectGraceMs, int64(1500)},
		{"grace seed as a runtime setting", c.Seed()["connection.reconnect_grace_ms"], int64(1500)},
		{"sync (file)", c.Storage.Sync, "interval"},
		{"quarantine (file)", c.Storage.Quarantine, "refuse"},
		{"partitions (file)", c.Queue.Partitions, 4},
		{"admin_listen (default)", c.AdminListen, "127.0.0.1:7655"},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.key, ch.got, ch.want)
		}
	}
}

func TestUnknownKeyIsNamed(t *testing.T) {
	_, err := Load(Sources{File: write(t, "[limits]\nprefetch_maximum = 3\n")})
	if err == nil || !strings.Contains(err.Error(), "limits.prefetch_maximum") {
		t.Fatalf("err %v, want the unknown key named", err)
	}
}

func TestBadValues(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SINEW_STORAGE_SYNC": "sometimes"}, "storage.sync"},
		{map[string]string{"SINEW_STORAGE_QUARANTINE": "delete"}, "storage.quarantine"},
		{map[string]string{"SINEW_LISTEN": "nope"}, "listen"},
		{map[string]string{"SINEW_RUNTIME_SEED_CONNECTION_RECONNECT_GRACE_MS": "-1"}, "runtime_seed.connection.reconnect_grace_ms: -1 is out of range 0..2147483648"},
		{map[string]string{"SINEW_LIMITS_BODY_BYTES_MAX": "9999999"}, "limits.body_bytes_max"},
		{map[string]string{"SINEW_LIMITS_PREFETCH_MAX": "ten"}, "SINEW_LIMITS_PREFETCH_MAX"},
		{map[string]string{"SINEW_QUEUE_PARTITIONS": "0"}, "queue.partitions"},
		{map[string]string{"SINEW_LOG_LEVEL": "loud"}, "log_level"},
		// Values that parse but would wrap where they are used.
		{map[string]string{"SINEW_RUNTIME_SEED_CONNECTION_DRAIN_TIMEOUT_MS": "9223372036854775807"}, "runtime_seed.connection.drain_timeout_ms: 9223372036854775807 is out of range 1..2147483648"},
		{map[string]string{"SINEW_RUNTIME_SEED_CONNECTION_DRAIN_TIMEOUT_MS": "0"}, "runtime_seed.connection.drain_timeout_ms: 0 is out of range 1..2147483648"},
		{map[string]string{"SINEW_LIMITS_PUBLISH_INFLIGHT_MAX": "4294967297"}, "limits.publish_inflight_max: 4294967297 is above 1048576"},
		{map[string]string{"SINEW_LIMITS_SUBSCRIPTIONS_MAX": "4294967297"}, "limits.subscriptions_max"},
		{map[string]string{"SINEW_QUEUE_LEASE_MS": "4294967297000"}, "queue.lease_ms"},
		{map[string]string{"SINEW_STORAGE_INBOX_MAX": "4294967297"}, "storage.inbox_max: 4294967297 is above 65536"},
		{map[string]string{"SINEW_QUEUE_MAX_RETRIES": "4294967297"}, "queue.max_retries: 4294967297 is above 1000000"},
		{map[string]string{"SINEW_CONNECTION_SLOW_CONSUMER_TIMEOUT_MS": "9223372036854775807"}, "connection.slow_consumer_timeout_ms"},
		{map[string]string{"SINEW_STORAGE_SEGMENT_BYTES": "9223372036854775807"}, "storage.segment_bytes"},
		{map[string]string{"SINEW_LIMITS_QUEUES_MAX": "0"}, "limits.queues_max"},
		{map[string]string{"SINEW_LIMITS_QUEUE_PARTITIONS_MAX": "1025"}, "limits.queue_partitions_max"},
		{map[string]string{"SINEW_LIMITS_PARTITIONS_TOTAL_MAX": "-1"}, "limits.partitions_total_max"},
		{map[string]string{"SINEW_QUEUE_PARTITIONS": "8", "SINEW_LIMITS_QUEUE_PARTITIONS_MAX": "4"}, "queue.partitions: 8 exceeds limits.queue_partitions_max"},
		{map[string]string{"SINEW_QUEUE_DELAY_MS_MAX": "0"}, "queue.delay_ms_max: 0 is out of range"},
		{map[string]string{"SINEW_QUEUE_TTL_MS_MAX": "-5"}, "queue.ttl_ms_max"},
		{map[string]string{"SINEW_QUEUE_NACK_DELAY_MS_MAX": "9223372036854775807"}, "queue.nack_delay_ms_max"},
		{map[string]string{"SINEW_AUTH_PASSWORD_HASHES_MAX": "0"}, "auth.password_hashes_max: 0 is not 1 to 64"},
		{map[string]string{"SINEW_AUTH_PASSWORD_HASHES_MAX": "65"}, "auth.password_hashes_max"},
		{map[string]string{"SINEW_STORAGE_BODY_CACHE_BYTES": "-1"}, "storage.body_cache_bytes: -1 is out of range 0 (no cache) to 1099511627776 (1 TiB)"},
		{map[string]string{"SINEW_STORAGE_BODY_CACHE_BYTES": "1099511627777"}, "storage.body_cache_bytes: 1099511627777 is out of range"},
		{map[string]string{"SINEW_STORAGE_RAFT_CACHE_BYTES": "4096"}, "storage.raft_cache_bytes: 4096 is out of range 1048576 (1 MiB) to 1099511627776 (1 TiB)"},
		{map[string]string{"SINEW_STORAGE_RAFT_CACHE_BYTES": "lots"}, "SINEW_STORAGE_RAFT_CACHE_BYTES"},
	}
	for _, tc := range cases {
		_, err := Load(Sources{Env: env(tc.env)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want it to name %s", tc.env, err, tc.want)
		}
	}
	if _, err := Load(Sources{File: write(t, "listen = 5\n")}); err == nil {
		t.Error("a mistyped file value was accepted")
	}
}

// A token too short to carry 128 bits stops the load, naming the token by
// its position, never by its value, and saying how to generate one.
func TestShortTokenRefused(t *testing.T) {
	good := strings.Repeat("0123456789abcdef", 2)
	_, err := Load(Sources{Env: env(map[string]string{"SINEW_AUTH_TOKENS": good + ",hunter2"})})
	if err == nil {
		t.Fatal("a 7-character token was accepted")
	}
	msg := err.Error()
	for _, want := range []string{"auth.tokens", "token 2 of 2", "7 characters", "at least 32", "sinew auth token"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "hunter2") || strings.Contains(msg, good) || strings.Contains(msg, "token 1") {
		t.Errorf("error %q names a token's value or a good token", msg)
	}
	if _, err := Load(Sources{Env: env(map[string]string{"SINEW_AUTH_TOKENS": good})}); err != nil {
		t.Fatalf("a 32-character token: %v", err)
	}
}

func TestEveryKeyHasAFlag(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	RegisterFlags(fs)
	for _, k := range Keys() {
		if fs.Lookup(FlagName(k)) == nil {
			t.Errorf("key %s has no flag", k)
		}
	}
	if len(Keys()) < 25 {
		t.Fatalf("only %d keys", len(Keys()))
	}
}

func TestTLSBothOrNeither(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		wantErr string
		enabled bool
	}{
		{env: map[string]string{}},
		{env: map[string]string{"SINEW_TLS_CERT_FILE": "/c.pem", "SINEW_TLS_KEY_FILE": "/k.pem"}, enabled: true},
		{env: map[string]string{"SINEW_TLS_CERT_FILE": "/c.pem"}, wantErr: "tls.key_file: must be set together with tls.cert_file"},
		{env: map[string]string{"SINEW_TLS_KEY_FILE": "/k.pem"}, wantErr: "tls.cert_file: must be set together with tls.key_file"},
	} {
		c, err := Load(Sources{Env: env(tc.env)})
		switch {
		case tc.wantErr == "" && err != nil:
			t.Fatalf("%v: %v", tc.env, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Fatalf("%v: error %v, want %q", tc.env, err, tc.wantErr)
		case tc.wantErr == "" && c.TLS.Enabled() != tc.enabled:
			t.Fatalf("%v: enabled %v", tc.env, c.TLS.Enabled())
		}
	}
	file := write(t, "[tls]\ncert_file = \"/c.pem\"\nkey_file = \"/k.pem\"\n")
	if c, err := Load(Sources{File: file}); err != nil || c.TLS.CertFile != "/c.pem" || c.TLS.KeyFile != "/k.pem" {
		t.Fatalf("from file: %+v, %v", c.TLS, err)
	}
}

// connection.reconnect_grace_ms became a runtime setting: naming the old key in
// any source stops startup with an error that says where it went.
func TestMovedKeyIsAClearError(t *testing.T) {
	want := "connection.reconnect_grace_ms is now a runtime setting: set runtime_seed.connection.reconnect_grace_ms"
	_, err := Load(Sources{File: write(t, "[connection]\nreconnect_grace_ms = 3000\n")})
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "PUT /api/v1/settings") {
		t.Errorf("file: %v", err)
	}
	_, err = Load(Sources{Env: env(map[string]string{"SINEW_CONNECTION_RECONNECT_GRACE_MS": "3000"})})
	if err == nil || !strings.Contains(err.Error(), "SINEW_CONNECTION_RECONNECT_GRACE_MS") || !strings.Contains(err.Error(), want) {
		t.Errorf("env: %v", err)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	RegisterFlags(fs)
	if err := fs.Parse([]string{"--connection-reconnect-grace-ms", "3000"}); err != nil {
		t.Fatal(err)
	}
	_, err = Load(Sources{Flags: fs})
	if err == nil || !strings.Contains(err.Error(), "--connection-reconnect-grace-ms") || !strings.Contains(err.Error(), want) {
		t.Errorf("flag: %v", err)
	}
}

// Every key of runtime_seed is a runtime setting, and every runtime setting
// has a seed key, so the seed section and the runtime keys cannot drift apart.
func TestRuntimeSeedMatchesRuntimeKeys(t *testing.T) {
	d := Default()
	seed := d.Seed()
	for _, k := range runtimesettings.Keys() {
		if _, ok := seed[k.Name]; !ok {
			t.Errorf("runtime setting %s has no runtime_seed key", k.Name)
		}
	}
	if len(seed) != len(runtimesettings.Keys()) {
		t.Errorf("runtime_seed has %d keys for %d runtime settings", len(seed), len(runtimesettings.Keys()))
	}
	if seed[runtimesettings.KeyReconnectGraceMs] != 5000 {
		t.Errorf("sinew serve's grace seed %d, want 5000", seed[runtimesettings.KeyReconnectGraceMs])
	}
}

// connection.drain_timeout_ms became a runtime setting too.
func TestMovedDrainTimeoutIsAClearError(t *testing.T) {
	want := "connection.drain_timeout_ms is now a runtime setting: set runtime_seed.connection.drain_timeout_ms"
	if _, err := Load(Sources{File: write(t, "[connection]\ndrain_timeout_ms = 3000\n")}); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("file: %v", err)
	}
	if _, err := Load(Sources{Env: env(map[string]string{"SINEW_CONNECTION_DRAIN_TIMEOUT_MS": "3000"})}); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("env: %v", err)
	}
	c, err := Load(Sources{File: write(t, "[runtime_seed.connection]\ndrain_timeout_ms = 3000\n")})
	if err != nil || c.Seed()[runtimesettings.KeyDrainTimeoutMs] != 3000 {
		t.Errorf("seed: %v %v", err, c.Seed())
	}
}
