package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/protocol"
)

// The node-wide memory budgets are served with their configured limits, in
// /metrics and in the overview, and a published message's body counts
// against body_cache until it is settled.
func TestMemoryBudgetsServed(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.Storage.BodyCacheBytes = 3 << 20
	cfg.Storage.RaftCacheBytes = 5 << 20
	addr, adminAddr, _ := runServeAdmin(t, cfg)

	pub, _ := hello(t, addr, protocol.ResumeIdentity{})
	if _, err := pub.Write(protocol.AppendFrame(nil, 0, 2, &protocol.Publish{Topic: "budget-jobs", Partition: -1, Body: make([]byte, 1000)})); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(pub)
	for {
		f, _, err := protocol.ReadFrame(br, 1<<21, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, err := protocol.Decode(f)
		if err != nil {
			t.Fatal(err)
		}
		if body.Op() == protocol.OpPublishOK {
			break
		}
		if _, ping := body.(*protocol.Ping); !ping {
			t.Fatalf("publish answered %T %+v", body, body)
		}
	}

	samples, types := scrape(t, adminAddr)
	for series, want := range map[string]float64{
		`sinew_memory_budget_bytes{budget="body_cache"}`: 3 << 20,
		`sinew_memory_budget_bytes{budget="raft_cache"}`: 5 << 20,
	} {
		if got, ok := samples[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	if used := samples[`sinew_memory_budget_used_bytes{budget="body_cache"}`]; used < 1000 {
		t.Errorf("body_cache used %v with an unsettled 1000-byte body cached", used)
	}
	if types["sinew_memory_budget_used_bytes"] != "gauge" || types["sinew_memory_budget_evicted_bytes_total"] != "counter" {
		t.Errorf("types: %v", types)
	}

	resp, err := (&http.Client{Timeout: safetyTimeoutMs * time.Millisecond}).Get("http://" + adminAddr + "/api/v1/overview")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ov admin.OverviewView
	if err := json.NewDecoder(resp.Body).Decode(&ov); err != nil {
		t.Fatal(err)
	}
	if b := ov.Budgets["body_cache"]; b.LimitBytes != 3<<20 || b.UsedBytes < 1000 {
		t.Errorf("overview body_cache %+v", b)
	}
	if b := ov.Budgets["raft_cache"]; b.LimitBytes != 5<<20 {
		t.Errorf("overview raft_cache %+v", b)
	}
}

// storage.body_cache_bytes = 0 turns the body cache off: no body_cache
// budget is served.
func TestMemoryBudgetBodyCacheOff(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.Storage.BodyCacheBytes = 0
	_, adminAddr, _ := runServeAdmin(t, cfg)
	samples, _ := scrape(t, adminAddr)
	if _, ok := samples[`sinew_memory_budget_bytes{budget="body_cache"}`]; ok {
		t.Error("body_cache budget served with the cache off")
	}
	if _, ok := samples[`sinew_memory_budget_bytes{budget="raft_cache"}`]; !ok {
		t.Error("raft_cache budget missing")
	}
}
