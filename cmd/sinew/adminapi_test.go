package main

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/protocol"
)

// apiPoll re-reads an admin endpoint until cond holds. Work the broker does
// after it answered a client (a dead-letter copy, a session going dormant)
// has no event a test can wait on across HTTP, so it polls, bounded by
// safetyTimeoutMs; running out is a failure.
func apiPoll(t *testing.T, what string, read func() bool) {
	t.Helper()
	deadline := time.Now().Add(safetyTimeoutMs * time.Millisecond)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !read() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen within %d ms", what, safetyTimeoutMs)
		}
		<-tick.C
	}
}

// The admin API against a real broker: queues declared, updated, inspected,
// purged and deleted; messages read with their headers and binary bodies,
// and reading leases nothing; a failed message listed as a dead letter with
// its reason and replayed to its source queue; sessions and connections,
// dormant ones included; and the overview's counters.
func TestAdminAPI(t *testing.T) {
	timers := make(chan graceTimer, 16)
	serveAfterFunc = func(d time.Duration, f func()) func() bool {
		timers <- graceTimer{d, f}
		return func() bool { return true }
	}
	t.Cleanup(func() { serveAfterFunc = nil })
	addr, adminAddr, _ := runServeAdmin(t, testServeConfig(t))
	api := "http://" + adminAddr + "/api/v1"
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()

	var ver admin.VersionView
	if code := httpJSON(t, "GET", api+"/version", "", &ver); code != 200 || ver.Version != serverVersion || ver.API != "v1" {
		t.Fatalf("version: %d %+v", code, ver)
	}

	// Declare, declare again, update limits.
	var q admin.QueueView
	if code := httpJSON(t, "PUT", api+"/queues/orders", `{"partitions": 2, "max_retries": 0}`, &q); code != 201 ||
		q.PartitionCount != 2 || q.Config.MaxRetries != 0 || q.State != "ok" {
		t.Fatalf("declare: %d %+v", code, q)
	}
	if code := httpJSON(t, "PUT", api+"/queues/orders", `{"partitions": 2, "max_retries": 0}`, &q); code != 200 {
		t.Fatalf("declare again: %d %+v", code, q)
	}
	if code := httpJSON(t, "PATCH", api+"/queues/orders", `{"lease_ms": 12345}`, &q); code != 200 || q.Config.LeaseMs != 12345 || q.Config.MaxRetries != 0 {
		t.Fatalf("patch: %d %+v", code, q)
	}
	var e admin.ErrorBody
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"PUT", "/queues/orders", `{"partitions": 3}`, 409, "conflict"},
		{"PATCH", "/queues/orders", `{"partitions": 3}`, 400, "bad_request"},
		{"PATCH", "/queues/orders", `{"lease_mss": 1}`, 400, "bad_request"},
		{"PATCH", "/queues/orders", `{"dead_letter_mode": "sideways"}`, 400, "bad_request"},
		{"PATCH", "/queues/orders", `{"lease_ms": -1}`, 400, "bad_request"},
		{"GET", "/queues/nope", "", 404, "not_found"},
		{"GET", "/queues/orders/messages", "", 400, "bad_request"},
		{"GET", "/queues/orders/messages?partition=9", "", 404, "not_found"},
		{"GET", "/queues/orders/messages?partition=0&limit=1000", "", 400, "bad_request"},
		{"POST", "/queues/orders", "", 405, "method_not_allowed"},
		{"POST", "/deadletters/replay", `{"items": []}`, 400, "bad_request"},
		{"GET", "/deadletters?cursor=zz", "", 400, "bad_request"},
	} {
		if code := httpJSON(t, tc.method, api+tc.path, tc.body, &e); code != tc.status || e.Code != tc.code || e.Error == "" {
			t.Errorf("%s %s %s: %d %+v, want %d %s", tc.method, tc.path, tc.body, code, e, tc.status, tc.code)
		}
	}

	c, err := sinew.Dial(ctx, addr, sinew.WithClientName("api-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	binary := []byte{0xff, 0x00, 0xfe, 'x'}
	if _, err := c.Publish(ctx, "orders", binary, sinew.WithPartition(0), sinew.WithKey([]byte("k-1")),
		sinew.WithHeader("trace", "abc"), sinew.WithContentType("application/octet-stream")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishText(ctx, "orders", "hello, world", sinew.WithPartition(0)); err != nil {
		t.Fatal(err)
	}
	var list admin.QueueList
	if code := httpJSON(t, "GET", api+"/queues", "", &list); code != 200 || len(list.Queues) != 1 || list.Queues[0].Ready != 2 ||
		list.Queues[0].Partitions[0].Ready != 2 || list.Queues[0].BytesOnDisk <= 0 {
		t.Fatalf("queues: %d %+v", code, list)
	}

	// Peek: headers, key, binary body intact; a preview cut short; twice,
	// and nothing was leased.
	var msgs admin.MessagesView
	for range 2 {
		if code := httpJSON(t, "GET", api+"/queues/orders/messages?partition=0&preview_bytes=5", "", &msgs); code != 200 || len(msgs.Messages) != 2 {
			t.Fatalf("peek: %d %+v", code, msgs)
		}
	}
	m0, m1 := msgs.Messages[0], msgs.Messages[1]
	// An offset range [from, to) holds only the first.
	var ranged admin.MessagesView
	if code := httpJSON(t, "GET", api+"/queues/orders/messages?partition=0&from="+itoa(m0.Offset)+"&to="+itoa(m1.Offset), "", &ranged); code != 200 ||
		len(ranged.Messages) != 1 || ranged.Messages[0].Offset != m0.Offset || ranged.Next != m1.Offset {
		t.Fatalf("range [%d, %d): %d %+v", m0.Offset, m1.Offset, code, ranged)
	}
	if got, _ := base64.StdEncoding.DecodeString(m0.BodyB64); string(got) != string(binary) || m0.BodyText != nil || m0.BodyBytes != 4 || m0.BodyTruncated {
		t.Errorf("binary message: %+v", m0)
	}
	if m0.KeyText == nil || *m0.KeyText != "k-1" || m0.ContentType != "application/octet-stream" || m0.State != "ready" ||
		len(m0.Headers) != 1 || m0.Headers[0].Key != "trace" || m0.Headers[0].Value == nil || *m0.Headers[0].Value != "abc" {
		t.Errorf("message metadata: %+v", m0)
	}
	if m1.BodyText == nil || *m1.BodyText != "hello" || !m1.BodyTruncated || m1.BodyBytes != 12 {
		t.Errorf("text preview: %+v", m1)
	}
	if code := httpJSON(t, "GET", api+"/queues/orders", "", &q); code != 200 || q.Ready != 2 || q.Inflight != 0 {
		t.Fatalf("after peeks: %d %+v", code, q)
	}

	// A consumer fails the first message: with max_retries 0 it is
	// dead-lettered at once, with its reason and source.
	sub, err := c.Subscribe(ctx, "orders", sinew.WithSubscribePartition(0), sinew.WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	got := <-sub.Messages()
	if string(got.Body) != string(binary) {
		t.Fatalf("first delivery %q", got.Body)
	}
	var sessions admin.SessionsView
	if code := httpJSON(t, "GET", api+"/sessions", "", &sessions); code != 200 || len(sessions.Sessions) != 1 ||
		sessions.Sessions[0].State != "attached" || sessions.Sessions[0].Inflight != 1 || len(sessions.Sessions[0].Subscriptions) != 1 ||
		sessions.Sessions[0].Subscriptions[0].Topic != "orders" || sessions.Sessions[0].GraceLeftMs != nil {
		t.Fatalf("sessions: %d %+v", code, sessions)
	}
	var conns admin.ConnectionsView
	if code := httpJSON(t, "GET", api+"/connections", "", &conns); code != 200 || len(conns.Connections) != 1 ||
		conns.Connections[0].ClientID != sessions.Sessions[0].ClientID || conns.Connections[0].Subscriptions != 1 {
		t.Fatalf("connections: %d %+v", code, conns)
	}
	if code := httpJSON(t, "GET", api+"/queues/orders/messages?partition=0", "", &msgs); code != 200 || msgs.Messages[0].State != "inflight" || msgs.Messages[0].Attempt != 1 {
		t.Fatalf("peek of a leased message: %d %+v", code, msgs)
	}
	if err := got.Fail(ctx); err != nil {
		t.Fatal(err)
	}
	var dl admin.DeadLettersView
	apiPoll(t, "dead letter listed", func() bool {
		return httpJSON(t, "GET", api+"/deadletters", "", &dl) == 200 && len(dl.DeadLetters) == 1
	})
	d := dl.DeadLetters[0]
	if d.Reason != "failed" || d.SourceTopic != "orders" || d.SourcePartition != 0 || d.SourceOffset != m0.Offset || dl.NextCursor != "" {
		t.Fatalf("dead letter: %+v", dl)
	}
	if b, _ := base64.StdEncoding.DecodeString(d.Message.BodyB64); string(b) != string(binary) {
		t.Fatalf("dead letter body %q", b)
	}

	// Replay it, keeping nothing: it is back on orders, the DLQ is empty.
	var rep admin.ReplayView
	body := `{"items": [{"partition": ` + itoa(d.Partition) + `, "offset": ` + itoa(d.Offset) + `}, {"partition": 0, "offset": 999999}]}`
	if code := httpJSON(t, "POST", api+"/deadletters/replay", body, &rep); code != 200 || len(rep.Results) != 2 {
		t.Fatalf("replay: %d %+v", code, rep)
	}
	if r := rep.Results[0]; r.Status != "replayed" || !r.Removed || r.TargetTopic != "orders" || r.Error != "" {
		t.Fatalf("replay result: %+v", r)
	}
	if r := rep.Results[1]; r.Status != "not_found" {
		t.Fatalf("replay of a missing offset: %+v", r)
	}
	if code := httpJSON(t, "GET", api+"/deadletters", "", &dl); code != 200 || len(dl.DeadLetters) != 0 {
		t.Fatalf("dead letters after replay: %d %+v", code, dl)
	}
	// The replayed message is on its source queue, at the place the
	// replay reported, with its key, header and binary body.
	r0 := rep.Results[0]
	path := "/queues/orders/messages?partition=" + itoa(r0.TargetPartition) + "&from=" + itoa(r0.TargetOffset) + "&limit=1"
	if code := httpJSON(t, "GET", api+path, "", &msgs); code != 200 || len(msgs.Messages) != 1 || msgs.Messages[0].Offset != r0.TargetOffset {
		t.Fatalf("replayed message: %d %+v", code, msgs)
	}
	if rm := msgs.Messages[0]; rm.BodyB64 != m0.BodyB64 || *rm.KeyText != "k-1" || len(rm.Headers) != 1 || *rm.Headers[0].Value != "abc" || rm.State != "ready" {
		t.Fatalf("replayed message lost its data: %+v", rm)
	}
	next := <-sub.Messages()
	if err := next.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	if code := httpJSON(t, "GET", api+"/queues/orders", "", &q); code != 200 || q.Ready+q.Inflight != 1 {
		t.Fatalf("orders after replay and one ack: %d %+v", code, q)
	}

	var ov admin.OverviewView
	if code := httpJSON(t, "GET", api+"/overview", "", &ov); code != 200 || !ov.Ready || ov.OwnerID == "" || ov.Generation == 0 ||
		ov.Counters["publishes"] != 2 || ov.Counters["deliveries"] < 2 || ov.Counters["fails"] != 1 || ov.Counters["acks"] != 1 ||
		ov.DeadLetteredByReason["failed"] != 1 || ov.Counters["dead_lettered"] != 1 || ov.Totals.SessionsAttached != 1 {
		t.Fatalf("overview: %d %+v", code, ov)
	}

	// Purge, then delete.
	var pv admin.PurgeView
	if code := httpJSON(t, "POST", api+"/queues/orders/purge", "", &pv); code != 200 {
		t.Fatalf("purge: %d %+v", code, pv)
	}
	var del admin.DeleteView
	if code := httpJSON(t, "DELETE", api+"/queues/orders", "", &del); code != 200 || !del.Deleted {
		t.Fatalf("delete: %d %+v", code, del)
	}
	if code := httpJSON(t, "GET", api+"/queues/orders", "", &e); code != 404 {
		t.Fatalf("deleted queue: %d", code)
	}

	// A cut socket leaves the session dormant, with its grace counting down.
	nc, ok := hello(t, addr, protocol.ResumeIdentity{})
	nc.Close()
	select {
	case <-timers:
	case <-time.After(safetyTimeoutMs * time.Millisecond):
		t.Fatal("no grace timer after a cut")
	}
	if code := httpJSON(t, "GET", api+"/sessions", "", &sessions); code != 200 {
		t.Fatalf("sessions: %d", code)
	}
	var dormant *admin.SessionView
	for i := range sessions.Sessions {
		if sessions.Sessions[i].ClientID == ok.Resume.ClientID {
			dormant = &sessions.Sessions[i]
		}
	}
	if dormant == nil || dormant.State != "dormant" || dormant.GraceLeftMs == nil || *dormant.GraceLeftMs <= 0 || *dormant.GraceLeftMs > 5000 {
		t.Fatalf("cut session: %+v in %+v", dormant, sessions)
	}

	// The drain is wired in sinew serve (TestAdminDrain follows it through).
	// A delivery held unsettled keeps its first phase going (with nothing
	// in flight the drain would end, and serve exit, before the next GET).
	if _, err := c.PublishText(ctx, "hold", "held through the drain"); err != nil {
		t.Fatal(err)
	}
	holdSub, err := c.Subscribe(ctx, "hold", sinew.WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	held := <-holdSub.Messages()
	var dv admin.DrainView
	if code := httpJSON(t, "POST", api+"/drain", "", &dv); code != 202 || !dv.Draining {
		t.Fatalf("drain: %d %+v", code, dv)
	}
	var after admin.OverviewView
	if code := httpJSON(t, "GET", api+"/overview", "", &after); code != 200 || !after.Draining {
		t.Fatalf("overview after the drain began: %d draining=%v", code, after.Draining)
	}
	// Settling it is still taken while draining, and lets the drain end.
	if err := held.Complete(ctx); err != nil {
		t.Fatalf("settle while draining: %v", err)
	}
}

func itoa[T ~uint32 | ~uint64](v T) string { return strconv.FormatUint(uint64(v), 10) }

// While the broker recovers, the admin listener already answers: alive,
// not ready, and the API says why; once serving, /readyz is 200.
func TestAdminAnswersWhileRecovering(t *testing.T) {
	probed := make(chan struct{})
	serveRecoveringHook = func(adminAddr string) {
		defer close(probed)
		get := func(path string) (int, string) {
			resp, err := (&http.Client{Timeout: safetyTimeoutMs * time.Millisecond}).Get("http://" + adminAddr + path)
			if err != nil {
				t.Errorf("GET %s during recovery: %v", path, err)
				return 0, ""
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
		if code, body := get("/healthz"); code != 200 || body != "ok\n" {
			t.Errorf("/healthz during recovery: %d %q", code, body)
		}
		if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "recovering") {
			t.Errorf("/readyz during recovery: %d %q", code, body)
		}
		if code, body := get("/api/v1/queues"); code != 503 || !strings.Contains(body, `"code": "unavailable"`) {
			t.Errorf("/api/v1/queues during recovery: %d %q", code, body)
		}
	}
	t.Cleanup(func() { serveRecoveringHook = nil })
	_, adminAddr, _ := runServeAdmin(t, testServeConfig(t))
	<-probed
	if code := httpJSON(t, "GET", "http://"+adminAddr+"/readyz", "", nil); code != 200 {
		t.Fatalf("/readyz once serving: %d", code)
	}
}

// A dead-letter listing walks page by page with its cursor, over every
// partition of the dead-letter queue, each dead letter once.
func TestAdminDeadLetterPages(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.Queue.Partitions = 2 // the global dead-letter queue is created with them
	addr, adminAddr, _ := runServeAdmin(t, cfg)
	api := "http://" + adminAddr + "/api/v1"
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()
	c, err := sinew.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.DeclareQueue(ctx, "pages", sinew.QueueConfig{MaxRetries: sinew.RetriesNone}); err != nil {
		t.Fatal(err)
	}
	const total = 5
	for i := range total {
		if _, err := c.PublishText(ctx, "pages", "p", sinew.WithKey([]byte{byte('a' + i)})); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "pages")
	if err != nil {
		t.Fatal(err)
	}
	for range total {
		if err := (<-sub.Messages()).Fail(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var dl admin.DeadLettersView
	apiPoll(t, "every dead letter listed", func() bool {
		return httpJSON(t, "GET", api+"/deadletters?limit=200", "", &dl) == 200 && len(dl.DeadLetters) == total
	})
	var dlq admin.QueueView
	if code := httpJSON(t, "GET", api+"/queues/"+dl.Topic, "", &dlq); code != 200 || dlq.PartitionCount != 2 || !dlq.DeadLetterQueue {
		t.Fatalf("dead-letter queue: %d %+v", code, dlq)
	}
	seen := map[string]bool{}
	cursor := ""
	for page := 0; ; page++ {
		if page > 2*total {
			t.Fatalf("the cursor does not end: %q", cursor)
		}
		if code := httpJSON(t, "GET", api+"/deadletters?limit=2&cursor="+cursor, "", &dl); code != 200 || len(dl.DeadLetters) > 2 {
			t.Fatalf("page %d: %d %+v", page, code, dl)
		}
		for _, d := range dl.DeadLetters {
			k := itoa(d.Partition) + ":" + itoa(d.Offset)
			if seen[k] || d.SourceTopic != "pages" || d.Reason != "failed" {
				t.Fatalf("page %d: %+v (seen %v)", page, d, seen)
			}
			seen[k] = true
		}
		if dl.NextCursor == "" {
			break
		}
		cursor = dl.NextCursor
	}
	if len(seen) != total {
		t.Fatalf("pages held %d dead letters, want %d", len(seen), total)
	}
}

// A replay with keep leaves the dead-letter copy in place, and the
// replayed message has its headers without the reserved sinew.* ones.
func TestAdminReplayKeep(t *testing.T) {
	cfg := testServeConfig(t)
	addr, adminAddr, _ := runServeAdmin(t, cfg)
	api := "http://" + adminAddr + "/api/v1"
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()
	c, err := sinew.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.DeclareQueue(ctx, "keep", sinew.QueueConfig{MaxRetries: sinew.RetriesNone}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishText(ctx, "keep", "k", sinew.WithHeader("trace", "t-1")); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "keep")
	if err != nil {
		t.Fatal(err)
	}
	if err := (<-sub.Messages()).Fail(ctx); err != nil {
		t.Fatal(err)
	}
	var dl admin.DeadLettersView
	apiPoll(t, "dead letter listed", func() bool {
		return httpJSON(t, "GET", api+"/deadletters", "", &dl) == 200 && len(dl.DeadLetters) == 1
	})
	d := dl.DeadLetters[0]
	var rep admin.ReplayView
	body := `{"keep": true, "items": [{"partition": ` + itoa(d.Partition) + `, "offset": ` + itoa(d.Offset) + `}]}`
	if code := httpJSON(t, "POST", api+"/deadletters/replay", body, &rep); code != 200 || len(rep.Results) != 1 ||
		rep.Results[0].Status != "replayed" || rep.Results[0].Removed || rep.Results[0].TargetTopic != "keep" {
		t.Fatalf("replay keep: %d %+v", code, rep)
	}
	if code := httpJSON(t, "GET", api+"/deadletters", "", &dl); code != 200 || len(dl.DeadLetters) != 1 || dl.DeadLetters[0].Offset != d.Offset {
		t.Fatalf("dead letters after a replay with keep: %d %+v", code, dl)
	}
	again := <-sub.Messages()
	if v, _ := again.Header("trace"); v != "t-1" || string(again.Body) != "k" {
		t.Fatalf("replayed message: %q %q", v, again.Body)
	}
	for _, h := range again.Headers {
		if strings.HasPrefix(h.Key, "sinew.") {
			t.Fatalf("replayed message carries the reserved header %s", h.Key)
		}
	}
}
