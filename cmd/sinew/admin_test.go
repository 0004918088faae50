package main

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/test/chaos/harness"
)

// startAdminTestBroker runs `sinew serve` in process (real broker on disk,
// admin API on loopback) and returns its client and admin addresses.
func startAdminTestBroker(t *testing.T) (clientAddr, adminAddr string) {
	t.Helper()
	clientAddr, adminAddr, _ = runServeAdmin(t, testServeConfig(t))
	return clientAddr, adminAddr
}

// freeAddr is a loopback address nobody listens on (outside the ephemeral
// port range: harness.FreeAddr).
func freeAddr(t *testing.T) string {
	t.Helper()
	a, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestAdminSettings: settings get shows the document; settings set changes
// a key against the current version, and one based on a stale version is
// refused with the version now current, changing nothing.
func TestAdminSettings(t *testing.T) {
	_, admin := startAdminTestBroker(t)
	code, out, errOut := runCmd(t, "", "admin", "settings", "get", "--admin-addr", admin)
	if code != 0 || !strings.HasPrefix(out, "runtime settings, version ") || !strings.Contains(out, "connection.reconnect_grace_ms") {
		t.Fatalf("settings get: exit %d, %q, %q", code, out, errOut)
	}
	var before apiSettings
	code, out, _ = runCmd(t, "", "admin", "settings", "get", "--json", "--admin-addr", admin)
	if err := json.Unmarshal([]byte(out), &before); code != 0 || err != nil || len(before.RuntimeKeys) == 0 {
		t.Fatalf("settings get --json: exit %d, %q, %v", code, out, err)
	}

	// Flags may follow the key=value arguments.
	code, out, errOut = runCmd(t, "", "admin", "settings", "set", "connection.reconnect_grace_ms=12345", "--admin-addr", admin, "--json")
	var after apiSettings
	if err := json.Unmarshal([]byte(out), &after); code != 0 || err != nil {
		t.Fatalf("settings set: exit %d, %q, %q", code, out, errOut)
	}
	if after.Version != before.Version+1 || after.Values["connection.reconnect_grace_ms"] != 12345 {
		t.Fatalf("after set: version %d (was %d), values %v", after.Version, before.Version, after.Values)
	}

	// Based on the old version: refused, and the answer names the current one.
	code, _, errOut = runCmd(t, "", "admin", "settings", "set", "--admin-addr", admin,
		"--version", jsonNum(before.Version), "connection.reconnect_grace_ms=1000")
	if code != 1 || !strings.Contains(errOut, "HTTP 409") || !strings.Contains(errOut, "at version "+jsonNum(after.Version)+" now") ||
		strings.Count(errOut, "\n") != 1 {
		t.Fatalf("stale set: exit %d, stderr %q", code, errOut)
	}
	code, out, _ = runCmd(t, "", "admin", "settings", "get", "--json", "--admin-addr", admin)
	var now apiSettings
	if err := json.Unmarshal([]byte(out), &now); code != 0 || err != nil || now.Version != after.Version || now.Values["connection.reconnect_grace_ms"] != 12345 {
		t.Fatalf("after the refused set: %q %v", out, err)
	}

	// A bad key is the broker's 400, on one line.
	code, _, errOut = runCmd(t, "", "admin", "settings", "set", "--admin-addr", admin, "no.such_key=1")
	if code != 1 || !strings.Contains(errOut, "HTTP 400") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("bad key: exit %d, stderr %q", code, errOut)
	}
}

func jsonNum(v uint64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestAdminErrors: bad input is a usage error (exit 2) before any request; an
// unreachable admin endpoint is one line (exit 1).
func TestAdminErrors(t *testing.T) {
	free := freeAddr(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"admin"}, 2, "missing command"},
		{[]string{"admin", "frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"admin", "queue"}, 2, "missing command"},
		{[]string{"admin", "queue", "show"}, 2, "--topic is required"},
		{[]string{"admin", "queue", "show", "--topic", "t", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"admin", "queue", "update", "--topic", "t"}, 2, "nothing to update"},
		{[]string{"admin", "queue", "update", "--topic", "t", "--partitions", "3"}, 2, "partitions"},
		{[]string{"admin", "queues", "--bogus"}, 2, "bogus"},
		{[]string{"admin", "queues", "--timeout", "0s"}, 2, "--timeout must be positive"},
		{[]string{"admin", "queues", "--admin-addr", "ftp://x:1"}, 2, "not host:port"},
		{[]string{"admin", "messages", "peek", "--topic", "t", "--limit", "0"}, 2, "--limit 0 is out of range"},
		{[]string{"admin", "messages", "peek", "--topic", "t", "--from", "5"}, 2, "--from needs --partition"},
		{[]string{"admin", "messages", "peek", "--topic", "t", "--body", "hex"}, 2, `--body "hex"`},
		{[]string{"admin", "dlq", "list", "--limit", "201"}, 2, "--limit 201 is out of range"},
		{[]string{"admin", "dlq", "replay"}, 2, "partition:offset"},
		{[]string{"admin", "dlq", "replay", "0:x"}, 2, `"0:x" is not partition:offset`},
		{[]string{"admin", "settings", "set"}, 2, "key=value"},
		{[]string{"admin", "settings", "set", "a=1.5"}, 2, `"a=1.5" is not key=integer`},
		{[]string{"admin", "settings", "set", "a=1", "a=2"}, 2, "a given twice"},
		{[]string{"admin", "drain", "now"}, 2, `unexpected argument "now"`},
		{[]string{"admin", "queues", "--admin-addr", free}, 1, "admin API at " + free + " unreachable"},
		{[]string{"admin", "settings", "set", "--admin-addr", free, "a=1"}, 1, "unreachable"},
	} {
		code, out, errOut := runCmd(t, "", tc.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		last := lines[len(lines)-1]
		if code != tc.code || !strings.Contains(last, tc.want) || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d mentioning %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
		if tc.code == 1 && len(lines) != 1 {
			t.Errorf("%v: %d lines on stderr, want one: %q", tc.args, len(lines), errOut)
		}
	}
	// A listener that never answers: the request gives up at --timeout, on one line.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	code, out, errOut := runCmd(t, "", "admin", "queues", "--timeout", "200ms", "--admin-addr", "http://"+silent.Addr().String()+"/")
	if code != 1 || out != "" || !strings.Contains(errOut, "did not answer in time (--timeout)") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("silent admin endpoint: exit %d, %q, %q", code, out, errOut)
	}
	if code, _, errOut := runCmd(t, "", "admin", "--help"); code != 0 || !strings.Contains(errOut, "dlq") {
		t.Errorf("admin --help: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runCmd(t, "", "help"); code != 0 || !strings.Contains(errOut, "admin") {
		t.Errorf("help does not list admin: %q", errOut)
	}
}
