package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// syncBuffer is a bytes.Buffer that several goroutines may write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The reconnect events are logged as JSON with the client id, the
// connection id and their counts, and no record carries a message body or
// a resume token.
func TestReconnectEventsLoggedWithoutSecrets(t *testing.T) {
	timers := make(chan graceTimer, 16)
	serveAfterFunc = func(d time.Duration, f func()) func() bool {
		timers <- graceTimer{d, f}
		return func() bool { return true }
	}
	t.Cleanup(func() { serveAfterFunc = nil })
	var logs syncBuffer
	logger := newLogger(&logs, "json", slog.LevelInfo)

	cfg := testServeConfig(t)
	cfg.AdminListen = "127.0.0.1:0"
	ready := make(chan string, 1)
	serveReadyHook = func(c, _ string) { ready <- c }
	t.Cleanup(func() { serveReadyHook = nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, logger) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	case <-time.After(safetyTimeoutMs * time.Millisecond):
		t.Fatal("serve did not start")
	}

	const secretBody = "body-that-must-not-be-logged-7f3a"
	nc, ok := hello(t, addr, protocol.ResumeIdentity{})
	if _, err := nc.Write(protocol.AppendFrame(nil, 0, 2, &protocol.Publish{Topic: "logs", Partition: -1, Body: []byte(secretBody)})); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	select {
	case <-timers:
	case <-time.After(safetyTimeoutMs * time.Millisecond):
		t.Fatal("no grace timer after the cut")
	}
	back, ok2 := hello(t, addr, ok.Resume)
	if ok2.Outcome != protocol.ResumeResumed {
		t.Fatalf("resume: %v", ok2.Outcome)
	}
	back.Close()
	<-timers
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	out := logs.String()
	token := ok.Resume.Token
	for _, secret := range []string{secretBody, string(token), hex.EncodeToString(token), base64.StdEncoding.EncodeToString(token), base64.RawURLEncoding.EncodeToString(token)} {
		if secret != "" && strings.Contains(out, secret) {
			t.Errorf("the log holds a secret %q", secret)
		}
	}
	want := map[string][]string{
		"session identity issued": {"client_id", "conn_id", "outcome"},
		"session entered grace":   {"client_id", "conn_id", "grace_ms", "subscriptions", "tags", "pending"},
		"resume accepted":         {"client_id", "conn_id", "flushed", "subscriptions", "tags"},
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		msg, _ := rec["msg"].(string)
		keys, wanted := want[msg]
		if !wanted {
			continue
		}
		seen[msg] = true
		for _, k := range keys {
			if _, has := rec[k]; !has {
				t.Errorf("%q lacks %s: %s", msg, k, line)
			}
		}
		if rec["client_id"] != ok2.Resume.ClientID && rec["client_id"] != ok.Resume.ClientID {
			t.Errorf("%q names client %v", msg, rec["client_id"])
		}
	}
	for msg := range want {
		if !seen[msg] {
			t.Errorf("no %q record in:\n%s", msg, out)
		}
	}
}
