package runtimesettings

import (
	"fmt"
	"slices"
)

// Names of the runtime settings.
const (
	// KeyReconnectGraceMs is how long a dropped session stays resumable, in
	// milliseconds; 0 cleans it up at once.
	KeyReconnectGraceMs = "connection.reconnect_grace_ms"
	// KeyRestartGraceMs is how long after a restart the sessions restored
	// from the data directory wait for their clients, and leases recovered
	// from the log for their owners, in milliseconds; 0 restores none.
	KeyRestartGraceMs = "connection.restart_grace_ms"
	// KeyDrainTimeoutMs bounds the first phase of a planned drain, in
	// milliseconds: how long work in flight may take to finish before the
	// broker closes the connections left.
	KeyDrainTimeoutMs = "connection.drain_timeout_ms"
)

// Key describes one runtime setting: its range and its value when neither the
// document nor the seed names it.
type Key struct {
	Name    string // dotted path, e.g. "connection.reconnect_grace_ms"
	Min     int64  // smallest accepted value
	Max     int64  // largest accepted value
	Default int64  // the library's value when the seed does not name the key
	Help    string // one-line meaning
}

// keys is every runtime setting, in the order documents and the API list them.
// A key added here is filled into existing documents from the seed at Open.
var keys = []Key{
	{
		Name: KeyReconnectGraceMs, Min: 0, Max: 1 << 31, Default: 0,
		Help: "How long a dropped session stays resumable, in milliseconds. 0 cleans it up at once: its leases go back to ready and a reconnecting client starts a fresh session. A change applies to disconnects after it; sessions already dormant keep the grace they started with.",
	},
	{
		Name: KeyRestartGraceMs, Min: 0, Max: 1 << 31, Default: 30_000,
		Help: "How long after a restart the sessions of the previous process stay resumable and keep their leases, in milliseconds. Leases nobody takes back go to ready when it ends. 0 restores no session: every lease found in the log goes back to ready at startup. Read at startup.",
	},
	{
		Name: KeyDrainTimeoutMs, Min: 1, Max: 1 << 31, Default: 10_000,
		Help: "How long the first phase of a planned drain (SIGTERM, POST /api/v1/drain) lets work in flight finish, in milliseconds: confirms, and settles of what consumers hold. It ends earlier once nothing is in flight; then connections close. Read when a drain starts.",
	},
}

// Keys returns every runtime setting.
func Keys() []Key { return slices.Clone(keys) }

// Lookup returns the description of name.
func Lookup(name string) (Key, bool) {
	for _, k := range keys {
		if k.Name == name {
			return k, true
		}
	}
	return Key{}, false
}

// Check reports whether v is a valid value of the setting name: the error wraps
// ErrUnknownKey or ErrOutOfRange and names the key.
func Check(name string, v int64) error {
	k, ok := Lookup(name)
	if !ok {
		return &KeyError{Key: name, Err: ErrUnknownKey, Msg: "not a runtime setting"}
	}
	if v < k.Min || v > k.Max {
		return &KeyError{Key: name, Err: ErrOutOfRange, Msg: fmt.Sprintf("%d is out of range %d..%d", v, k.Min, k.Max)}
	}
	return nil
}
