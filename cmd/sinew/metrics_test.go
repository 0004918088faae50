package main

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// scrape GETs /metrics and returns each sample line's value by its series
// ("name" or "name{labels}") and the TYPE of each family.
func scrape(t *testing.T, adminAddr string) (samples map[string]float64, types map[string]string) {
	t.Helper()
	return scrapeAs(t, adminAddr, "")
}

// scrapeAs is scrape with an Authorization header ("" sends none), for an
// admin listener that asks for credentials.
func scrapeAs(t *testing.T, adminAddr, authz string) (samples map[string]float64, types map[string]string) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+adminAddr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := (&http.Client{Timeout: safetyTimeoutMs * time.Millisecond}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics: %d %q\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	samples, types = map[string]float64{}, map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			types[name] = typ
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		samples[line[:i]] = v
	}
	return samples, types
}

// /metrics keeps every metric Sinew exported before client_golang, under the
// same names and types, and adds the reconnect counters; the grace, resume,
// repeated and rejected settle ones count what the real broker did.
func TestMetricsNamesAndReconnectCounters(t *testing.T) {
	timers := make(chan graceTimer, 16)
	serveAfterFunc = func(d time.Duration, f func()) func() bool {
		timers <- graceTimer{d, f}
		return func() bool { return true }
	}
	t.Cleanup(func() { serveAfterFunc = nil })
	addr, adminAddr, _ := runServeAdmin(t, testServeConfig(t))

	// A raw connection publishes one message (creating the queue) and stays
	// open, so the only grace timers are the ones below.
	pub, _ := hello(t, addr, protocol.ResumeIdentity{})
	if _, err := pub.Write(protocol.AppendFrame(nil, 0, 2, &protocol.Publish{Topic: "metrics-jobs", Partition: -1, Body: []byte("x")})); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(pub)
	next := func() protocol.Body {
		t.Helper()
		for {
			f, _, err := protocol.ReadFrame(br, 1<<21, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := protocol.Decode(f)
			if err != nil {
				t.Fatal(err)
			}
			if _, ping := body.(*protocol.Ping); !ping {
				return body
			}
		}
	}
	if body := next(); body.Op() != protocol.OpPublishOK {
		t.Fatalf("publish answered %T %+v", body, body)
	}

	// Late and repeated settles on the real broker: the same ACK twice (the
	// second is answered from the outcome table), a tag never issued
	// (unknown_tag), and a lease of an epoch a single node never issues
	// (stale_lease).
	pub.Write(protocol.AppendFrame(nil, 0, 3, &protocol.Subscribe{Topic: "metrics-jobs", Partition: -1, AckMode: protocol.AckManual, Prefetch: 1}))
	var d *protocol.Deliver
	for d == nil {
		switch b := next().(type) {
		case *protocol.Deliver:
			d = b
		case *protocol.SubscribeOK:
		default:
			t.Fatalf("after SUBSCRIBE: %T %+v", b, b)
		}
	}
	settle := func(req uint64, s *protocol.Settle) protocol.Code {
		t.Helper()
		pub.Write(protocol.AppendFrame(nil, 0, req, s))
		r, ok := next().(*protocol.SettleResult)
		if !ok || len(r.Codes) != 1 {
			t.Fatalf("settle answered %+v", r)
		}
		return r.Codes[0]
	}
	if c := settle(4, &protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{d.Tag}}); c != protocol.CodeOK {
		t.Fatalf("ack: %v", c)
	}
	if c := settle(5, &protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{d.Tag}}); c != protocol.CodeOK {
		t.Fatalf("repeated ack: %v", c)
	}
	if c := settle(6, &protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{d.Tag + 100}}); c != protocol.CodeUnknownTag {
		t.Fatalf("ack of a tag never issued: %v", c)
	}
	ref := protocol.LeaseRef{SubID: d.SubID, Partition: d.Partition, Offset: d.Offset, LeaseID: d.LeaseID, Epoch: 1}
	if c := settle(7, &protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{d.Tag}, Leases: []protocol.LeaseRef{ref}}); c != protocol.CodeStaleLease {
		t.Fatalf("ack of another epoch's lease: %v", c)
	}

	// One session goes dormant and its grace runs out; another goes dormant
	// and comes back.
	nextTimer := func() graceTimer {
		t.Helper()
		select {
		case g := <-timers:
			return g
		case <-time.After(safetyTimeoutMs * time.Millisecond):
			t.Fatal("no grace timer started after a disconnect")
			return graceTimer{}
		}
	}
	expired, okE := hello(t, addr, protocol.ResumeIdentity{})
	expired.Close()
	gE := nextTimer()
	back, okB := hello(t, addr, protocol.ResumeIdentity{})
	back.Close()
	nextTimer()
	gE.fire()
	if _, ok := hello(t, addr, okB.Resume); ok.Outcome != protocol.ResumeResumed {
		t.Fatalf("resume: %v", ok.Outcome)
	}
	if _, ok := hello(t, addr, okE.Resume); ok.Outcome != protocol.ResumeNotFound {
		t.Fatalf("resume after expiry: %v", ok.Outcome)
	}

	samples, types := scrape(t, adminAddr)
	for name, typ := range map[string]string{
		// Every metric /metrics had before, same name and type.
		"sinew_connections_open": "gauge", "sinew_connections_accepted_total": "counter", "sinew_connections_rejected_total": "counter",
		"sinew_frames_in_total": "counter", "sinew_frames_out_total": "counter", "sinew_publishes_total": "counter",
		"sinew_publish_errors_total": "counter", "sinew_publishes_inflight": "gauge", "sinew_settles_total": "counter",
		"sinew_request_errors_total": "counter", "sinew_fatal_errors_total": "counter", "sinew_reader_pauses_total": "counter",
		"sinew_sessions": "gauge", "sinew_sessions_dormant": "gauge", "sinew_sessions_resumed_total": "counter",
		"sinew_sessions_resume_rejected_total": "counter", "sinew_sessions_grace_expired_total": "counter",
		"sinew_sessions_requeued_total": "counter", "sinew_sessions_resent_total": "counter", "sinew_writer_pauses_total": "counter",
		"sinew_slow_consumers_total": "counter", "sinew_sessions_dormant_capped_total": "counter",
		"sinew_sessions_dormant_paused_total": "counter", "sinew_sessions_resend_unkept_total": "counter",
		"sinew_queue_ready": "gauge", "sinew_queue_delayed": "gauge", "sinew_queue_inflight": "gauge", "sinew_queue_consumers": "gauge",
		// Producer deduplication, per partition.
		"sinew_queue_dedup_producers": "gauge", "sinew_queue_dedup_evicted_idle_total": "counter",
		"sinew_queue_dedup_evicted_limit_total": "counter", "sinew_queue_publish_duplicates_total": "counter",
		// The reconnect counters.
		"sinew_session_resumes_total": "counter", "sinew_sessions_grace_entered_total": "counter",
		"sinew_sessions_grace_requeued_total": "counter", "sinew_sessions_ended_total": "counter",
		"sinew_reconcile_actions_total": "counter", "sinew_inflight_reconcile_total": "counter",
		"sinew_late_settles_accepted_total": "counter", "sinew_late_settles_rejected_total": "counter",
		"sinew_settles_repeated_total": "counter",
		// The Go runtime collector.
		"go_goroutines": "gauge",
	} {
		if types[name] != typ {
			t.Errorf("%s: type %q, want %q", name, types[name], typ)
		}
	}
	for series, want := range map[string]float64{
		`sinew_session_resumes_total{outcome="resumed"}`:                                     1,
		`sinew_session_resumes_total{outcome="not_found"}`:                                   1,
		`sinew_session_resumes_total{outcome="rejected"}`:                                    0,
		"sinew_sessions_resumed_total":                                                       1,
		"sinew_sessions_grace_entered_total":                                                 2,
		"sinew_sessions_grace_expired_total":                                                 1,
		`sinew_reconcile_actions_total{action="keep"}`:                                       0,
		`sinew_inflight_reconcile_total{action="resent"}`:                                    0,
		`sinew_late_settles_rejected_total{reason="stale_lease"}`:                            1,
		`sinew_late_settles_rejected_total{reason="unknown_tag"}`:                            1,
		"sinew_settles_repeated_total":                                                       1,
		`sinew_late_settles_rejected_total{reason="other"}`:                                  0,
		`sinew_queue_ready{group="",partition="0",topic="metrics-jobs"}`:                     0,
		`sinew_queue_dedup_evicted_limit_total{group="",partition="0",topic="metrics-jobs"}`: 0,
		"sinew_publishes_total":                                                              1,
	} {
		if got, ok := samples[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
}
