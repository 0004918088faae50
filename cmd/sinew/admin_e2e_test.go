package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/protocol"
)

// adminJSON runs an admin command with --json against the admin API at addr
// and decodes its output into v.
func adminJSON(t *testing.T, addr string, v any, args ...string) {
	t.Helper()
	args = append(append([]string{"admin"}, args...), "--json", "--admin-addr", addr)
	code, out, errOut := runCmd(t, "", args...)
	if code != 0 {
		t.Fatalf("%v: exit %d, stderr %q", args, code, errOut)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("%v: output is not JSON: %v\n%s", args, err, out)
	}
}

// adminText runs an admin command for its table and fails on a non-zero exit.
func adminText(t *testing.T, addr string, args ...string) string {
	t.Helper()
	args = append(append([]string{"admin"}, args...), "--admin-addr", addr)
	code, out, errOut := runCmd(t, "", args...)
	if code != 0 {
		t.Fatalf("%v: exit %d, stderr %q", args, code, errOut)
	}
	return out
}

func findQueue(qs apiQueues, topic, group string) (apiQueue, bool) {
	for _, q := range qs.Queues {
		if q.Topic == topic && q.Group == group {
			return q, true
		}
	}
	return apiQueue{}, false
}

// TestAdminAgainstBroker runs the admin commands against the real broker
// (sinew serve in process, data on disk): queues and their depth, messages
// peek that leases nothing, a dead letter listed with its reason and
// replayed to its source, sessions attached and dormant, declare, update,
// purge and delete.
func TestAdminAgainstBroker(t *testing.T) {
	graceStarted := make(chan struct{}, 4)
	serveAfterFunc = func(d time.Duration, f func()) func() bool {
		graceStarted <- struct{}{} // never fires: the dormant session stays for the test
		return func() bool { return true }
	}
	t.Cleanup(func() { serveAfterFunc = nil })
	client, admin := startAdminTestBroker(t)
	bin := "\x00\xff\x1b[0m"
	if code, _, errOut := runCmd(t, "plain\n"+bin+"\n", "publish", "--addr", client, "--topic", "orders",
		"--key", "k1", "--header", "h=v"); code != 0 {
		t.Fatalf("publish exit %d: %s", code, errOut)
	}

	var qs apiQueues
	adminJSON(t, admin, &qs, "queues")
	q, ok := findQueue(qs, "orders", "")
	if !ok || q.Ready != 2 || q.State != "ok" || q.PartitionCount < 1 || len(q.Partitions) != int(q.PartitionCount) {
		t.Fatalf("queues: orders %+v (found %v)", q, ok)
	}
	if out := adminText(t, admin, "queues"); !strings.Contains(out, "orders") || !strings.HasPrefix(out, "TOPIC") {
		t.Fatalf("queues table:\n%s", out)
	}
	if out := adminText(t, admin, "queue", "show", "--topic", "orders"); !strings.Contains(out, "PARTITION") {
		t.Fatalf("queue show:\n%s", out)
	}

	// Peek every partition: both messages, bytes exact, key and header shown.
	var pages struct {
		Pages []apiMessages `json:"pages"`
	}
	adminJSON(t, admin, &pages, "messages", "peek", "--topic", "orders")
	var bodies []string
	for _, p := range pages.Pages {
		for _, m := range p.Messages {
			body, err := base64.StdEncoding.DecodeString(m.BodyB64)
			if err != nil || m.State != "ready" || m.Attempt != 0 || m.KeyB64 != b64("k1") || len(m.Headers) != 1 ||
				m.Headers[0].Key != "h" || m.Headers[0].Value == nil || *m.Headers[0].Value != "v" {
				t.Fatalf("peeked %+v (%v)", m, err)
			}
			bodies = append(bodies, string(body))
		}
	}
	sort.Strings(bodies)
	if len(bodies) != 2 || bodies[0] != bin || bodies[1] != "plain" {
		t.Fatalf("peeked bodies %q", bodies)
	}
	out := adminText(t, admin, "messages", "peek", "--topic", "orders")
	if !strings.Contains(out, `body (6 bytes): "\x00\xff\x1b[0m"`) || !strings.Contains(out, "body (5 bytes): plain") {
		t.Fatalf("messages peek text:\n%s", out)
	}
	// Peeking leased nothing: a consumer gets both on their first attempt.
	code, out, errOut := runCmd(t, "", "consume", "--addr", client, "--topic", "orders", "--count", "2", "--json")
	if code != 0 {
		t.Fatalf("consume: exit %d %s", code, errOut)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m consumeJSON
		if err := json.Unmarshal([]byte(l), &m); err != nil || m.Attempt != 1 {
			t.Fatalf("after a peek, consumed %q (%v); want attempt 1", l, err)
		}
	}

	// A failed message is dead-lettered: listed with its reason and source,
	// then replayed to its source queue and removed from the dead letters.
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()
	c, err := sinew.Dial(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Publish(ctx, "jobs", []byte("job-1"), sinew.WithHeaders(sinew.Header{Key: "trace", Value: "t1"})); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "jobs", sinew.WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	m := <-sub.Messages()
	if m == nil {
		t.Fatalf("no delivery: %v", sub.Err())
	}
	if err := m.Fail(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sub.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	// The copy to the dead-letter queue is made after the FAIL is answered.
	// A peek of the dead-letter queue waits for it, shows why it died, and
	// hands it back, so it is still a dead letter afterwards.
	code, out, errOut = runCmd(t, "", "consume", "--addr", client, "--topic", "sinew.dead-letter", "--peek", "--count", "1",
		"--idle-exit", fmt.Sprint(safetyTimeoutMs*time.Millisecond))
	if code != 0 || !strings.Contains(out, "header sinew.reason: failed\n") || !strings.Contains(out, "header sinew.source.topic: jobs\n") {
		t.Fatalf("peek of the dead-letter queue: exit %d, %q, %q", code, out, errOut)
	}
	var dl apiDeadLetters
	adminJSON(t, admin, &dl, "dlq", "list")
	if len(dl.DeadLetters) != 1 {
		t.Fatalf("dead letters %+v", dl)
	}
	d := dl.DeadLetters[0]
	if d.Reason != "failed" || d.SourceTopic != "jobs" || d.SourceOffset != m.Offset || d.SourcePartition != m.Partition {
		t.Fatalf("dead letter %+v, failed message %d:%d", d, m.Partition, m.Offset)
	}
	if out := adminText(t, admin, "dlq", "list"); !strings.Contains(out, "failed") || !strings.Contains(out, "job-1") {
		t.Fatalf("dlq list table:\n%s", out)
	}
	item := fmt.Sprintf("%d:%d", d.Partition, d.Offset)
	var res apiReplayResults
	adminJSON(t, admin, &res, "dlq", "replay", item)
	if len(res.Results) != 1 || res.Results[0].Status != "replayed" || !res.Results[0].Removed || res.Results[0].TargetTopic != "jobs" {
		t.Fatalf("replay %+v", res)
	}
	adminJSON(t, admin, &dl, "dlq", "list")
	if len(dl.DeadLetters) != 0 {
		t.Fatalf("after replay without --keep, dead letters %+v", dl.DeadLetters)
	}
	sub, err = c.Subscribe(ctx, "jobs", sinew.WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	m = <-sub.Messages()
	if m == nil || string(m.Body) != "job-1" {
		t.Fatalf("replayed message %+v (%v)", m, sub.Err())
	}
	if v, _ := m.Header("trace"); v != "t1" {
		t.Fatalf("replayed message lost its header: %+v", m.Headers)
	}
	if err := m.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	// Replaying it again: it is gone, and the command says so with exit 1.
	code, out, errOut = runCmd(t, "", "admin", "dlq", "replay", item, "--admin-addr", admin)
	if code != 1 || strings.Contains(out, "replayed ") || !strings.Contains(errOut, "not every dead letter was replayed: 1 of 1") {
		t.Fatalf("second replay: exit %d, %q, %q", code, out, errOut)
	}

	// Sessions: the SDK client is attached with its subscription; a raw
	// client whose socket is cut stays dormant for its grace.
	raw, _ := hello(t, client, protocol.ResumeIdentity{})
	raw.Close()
	select { // the broker starts the grace timer once the session is dormant
	case <-graceStarted:
	case <-time.After(safetyTimeoutMs * time.Millisecond):
		t.Fatal("no grace timer started after the cut")
	}
	var ss apiSessions
	adminJSON(t, admin, &ss, "sessions")
	if countState(ss, "dormant") != 1 || countState(ss, "attached") != 1 {
		t.Fatalf("sessions %+v", ss)
	}
	for _, s := range ss.Sessions {
		if s.State == "dormant" && (s.GraceLeftMs == nil || *s.GraceLeftMs <= 0 || s.ConnID != 0) {
			t.Fatalf("dormant session %+v", s)
		}
		if s.State == "attached" && (len(s.Subscriptions) != 1 || s.Subscriptions[0].Topic != "jobs") {
			t.Fatalf("attached session %+v", s)
		}
	}
	if out := adminText(t, admin, "sessions"); !strings.Contains(out, "dormant") || !strings.Contains(out, "jobs/(default)") {
		t.Fatalf("sessions table:\n%s", out)
	}
	var cs apiConnections
	adminJSON(t, admin, &cs, "connections")
	if len(cs.Connections) != 1 {
		t.Fatalf("connections %+v", cs)
	}

	// Declare, update, purge, delete.
	var dq apiQueue
	adminJSON(t, admin, &dq, "queue", "declare", "--topic", "made", "--group", "g", "--partitions", "2", "--max-retries", "3")
	if dq.PartitionCount != 2 || dq.Config.MaxRetries != 3 || dq.Group != "g" {
		t.Fatalf("declared %+v", dq)
	}
	adminJSON(t, admin, &dq, "queue", "update", "--topic", "made", "--group", "g", "--lease-ms", "7000")
	if dq.Config.LeaseMs != 7000 || dq.Config.MaxRetries != 3 {
		t.Fatalf("updated %+v", dq)
	}
	code, _, errOut = runCmd(t, "", "admin", "queue", "declare", "--topic", "made", "--group", "g", "--partitions", "3", "--admin-addr", admin)
	if code != 1 || !strings.Contains(errOut, "HTTP 409") {
		t.Fatalf("declare with another partition count: exit %d, %q", code, errOut)
	}
	code, _, errOut = runCmd(t, "", "admin", "queue", "declare", "--topic", "neg", "--partitions", "-3", "--admin-addr", admin)
	if code != 2 || !strings.Contains(errOut, "--partitions -3: give 1 or more (0, or no flag, takes the broker's default)") {
		t.Fatalf("declare --partitions -3: exit %d, %q", code, errOut)
	}
	code, _, errOut = runCmd(t, "", "admin", "queue", "declare", "--topic", "big", "--max-retries", "9999999999", "--admin-addr", admin)
	if code != 1 || !strings.Contains(errOut, `field "max_retries": a number 9999999999 where it takes a whole number`) {
		t.Fatalf("declare --max-retries 9999999999: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runCmd(t, "a\nb\n", "publish", "--addr", client, "--topic", "made", "--group", "g"); code != 0 {
		t.Fatalf("publish: %s", errOut)
	}
	if out := adminText(t, admin, "queue", "purge", "--topic", "made", "--group", "g"); out != "purged 2 messages from queue \"made\" group \"g\"\n" {
		t.Fatalf("purge: %q", out)
	}
	if out := adminText(t, admin, "queue", "delete", "--topic", "made", "--group", "g"); out != "deleted queue \"made\" group \"g\"\n" {
		t.Fatalf("delete: %q", out)
	}
	code, _, errOut = runCmd(t, "", "admin", "queue", "show", "--topic", "made", "--group", "g", "--admin-addr", admin)
	if code != 1 || !strings.Contains(errOut, "not_found (HTTP 404)") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("show of a deleted queue: exit %d, %q", code, errOut)
	}

	var ov apiOverview
	adminJSON(t, admin, &ov, "overview")
	if ov.Version != serverVersion || !ov.Ready || ov.Counters["publishes"] < 5 || ov.OwnerID == "" {
		t.Fatalf("overview %+v", ov)
	}
	if out := adminText(t, admin, "version"); !strings.Contains(out, "broker: "+serverVersion+" (api v1)") {
		t.Fatalf("version: %q", out)
	}
}

func countState(ss apiSessions, state string) int {
	n := 0
	for _, s := range ss.Sessions {
		if s.State == state {
			n++
		}
	}
	return n
}

// TestAdminDrainAgainstBroker: sinew admin drain starts the broker's planned
// drain; while a client holds an unsettled delivery the broker stays up and
// says it is draining; once the client acks, its connection is closed and
// serve ends without error.
func TestAdminDrainAgainstBroker(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.RuntimeSeed.Connection.DrainTimeoutMs = 10 * safetyTimeoutMs // far beyond any wait below
	client, admin, stop := runServeAdmin(t, cfg)
	nc, _ := hello(t, client, protocol.ResumeIdentity{})
	c := &rawConn{t: t, nc: nc, br: bufio.NewReader(nc)}
	c.send(&protocol.Publish{Topic: "drained", Partition: -1, Body: []byte("held")})
	rawNext[*protocol.PublishOK](c)
	c.send(&protocol.Subscribe{Topic: "drained", Partition: -1, Prefetch: 1})
	rawNext[*protocol.SubscribeOK](c)
	d := rawNext[*protocol.Deliver](c)

	if out := adminText(t, admin, "drain"); out != "drain started on the broker at "+admin+"\n" {
		t.Fatalf("drain: %q", out)
	}
	rawNext[*protocol.GoingAway](c)
	var again struct {
		Draining bool `json:"draining"`
	}
	adminJSON(t, admin, &again, "drain") // already under way: accepted again
	var ov apiOverview
	adminJSON(t, admin, &ov, "overview")
	if !again.Draining || !ov.Draining {
		t.Fatalf("second drain %+v, overview draining %v", again, ov.Draining)
	}
	c.send(&protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{d.Tag}})
	if r := rawNext[*protocol.SettleResult](c); len(r.Codes) != 1 || r.Codes[0] != protocol.CodeOK {
		t.Fatalf("ack while draining: %+v", r)
	}
	if b, err := c.next(); err == nil {
		t.Fatalf("got %s after the drain, want the connection closed", b.Op())
	}
	if err := stop(); err != nil {
		t.Fatalf("serve after the drain: %v", err)
	}
}
