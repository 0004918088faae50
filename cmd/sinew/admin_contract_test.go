package main

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// These tests check the CLI against the admin API contract of
// docs/operations.md: the requests each command sends (method, path, query,
// body) and how it shows the documented answers, binary bodies included.
// The answers are the contract's examples; admin_test.go runs the commands
// against the real broker.

type recordedRequest struct {
	method, path, query, body string
}

type contractServer struct {
	t    *testing.T
	mu   sync.Mutex
	reqs []recordedRequest
	addr string
}

// route answers one method and path with a status and a JSON body.
type route struct {
	status int
	body   string
}

func newContractServer(t *testing.T, routes map[string]route) *contractServer {
	cs := &contractServer{t: t}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		cs.mu.Lock()
		cs.reqs = append(cs.reqs, recordedRequest{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, string(body)})
		cs.mu.Unlock()
		rt, ok := routes[r.Method+" "+r.URL.EscapedPath()]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rt.status)
		io.WriteString(w, rt.body)
	}))
	t.Cleanup(srv.Close)
	cs.addr = strings.TrimPrefix(srv.URL, "http://")
	return cs
}

func (cs *contractServer) last() recordedRequest {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(cs.reqs) == 0 {
		cs.t.Fatal("no request was made")
	}
	return cs.reqs[len(cs.reqs)-1]
}

// lastOf is the last request made with method: a command may follow its
// request with a read (user add checks whether credentials are now needed).
func (cs *contractServer) lastOf(method string) recordedRequest {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for i := len(cs.reqs) - 1; i >= 0; i-- {
		if cs.reqs[i].method == method {
			return cs.reqs[i]
		}
	}
	cs.t.Fatalf("no %s request was made", method)
	return recordedRequest{}
}

func (cs *contractServer) run(args ...string) (int, string, string) {
	cs.t.Helper()
	return runCmd(cs.t, "", append(args, "--admin-addr", cs.addr)...)
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

const contractQueue = `{"topic": "or ders", "group": "", "partition_count": 2, "dead_letter_queue": false,
 "config": {"dead_letter_mode": "default", "dead_letter_target": "", "max_retries": 5, "default_ttl_ms": 0, "lease_ms": 30000},
 "state": "quarantined", "ready": 10, "delayed": 1, "inflight": 2, "dead_lettering": 0, "consumers": 1, "bytes_on_disk": 1048576,
 "partitions": [
  {"partition": 0, "state": "ok", "reason": "", "ready": 7, "delayed": 1, "inflight": 2, "dead_lettering": 0, "consumers": 1,
   "next_offset": 120, "settled_frontier": 100, "bytes_on_disk": 786432, "checkpoint_failures": 0, "relocated": 0},
  {"partition": 1, "state": "quarantined", "reason": "crc mismatch at 4096", "ready": 3, "delayed": 0, "inflight": 0, "dead_lettering": 0,
   "consumers": 1, "next_offset": 40, "settled_frontier": 37, "bytes_on_disk": 262144, "checkpoint_failures": 0, "relocated": 0}]}`

func TestAdminQueuesContract(t *testing.T) {
	cs := newContractServer(t, map[string]route{
		"GET /api/v1/queues":                  {200, `{"queues": [` + contractQueue + `]}`},
		"GET /api/v1/queues/or%20ders":        {200, contractQueue},
		"POST /api/v1/queues/or%20ders/purge": {200, `{"purged": 12}`},
		"DELETE /api/v1/queues/gone":          {404, `{"code": "not_found", "error": "queue \"gone\" group \"\" does not exist"}`},
		"PUT /api/v1/queues/or%20ders":        {201, contractQueue},
		"PATCH /api/v1/queues/or%20ders":      {200, contractQueue},
	})
	code, out, errOut := cs.run("admin", "queues")
	if code != 0 {
		t.Fatalf("queues: exit %d, %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "TOPIC") || strings.Join(strings.Fields(lines[1]), " ") != "or ders (default) quarantined 2 10 1 2 0 1 1.0 MiB" {
		t.Fatalf("queues table:\n%s", out)
	}
	code, out, _ = cs.run("admin", "queues", "--json")
	var qs apiQueues
	if err := json.Unmarshal([]byte(out), &qs); code != 0 || err != nil || qs.Queues[0].Partitions[1].Reason != "crc mismatch at 4096" {
		t.Fatalf("queues --json: %q %v", out, err)
	}

	code, out, errOut = cs.run("admin", "queue", "show", "--topic", "or ders", "--group", "g/1")
	if r := cs.last(); code != 0 || r.method != "GET" || r.path != "/api/v1/queues/or%20ders" || r.query != "group=g%2F1" {
		t.Fatalf("queue show: exit %d %s, request %+v", code, errOut, r)
	}
	if !strings.Contains(out, "crc mismatch at 4096") || !strings.Contains(out, "lease") || !strings.Contains(out, "SETTLED-FRONTIER") {
		t.Fatalf("queue show:\n%s", out)
	}

	code, out, _ = cs.run("admin", "queue", "purge", "--topic", "or ders")
	if r := cs.last(); code != 0 || out != "purged 12 messages from queue \"or ders\" group \"\"\n" || r.method != "POST" || r.query != "" {
		t.Fatalf("purge: exit %d, %q, %+v", code, out, r)
	}
	code, out, errOut = cs.run("admin", "queue", "delete", "--topic", "gone")
	if code != 1 || out != "" || errOut != "sinew admin: admin API at "+cs.addr+": not_found (HTTP 404): queue \"gone\" group \"\" does not exist\n" {
		t.Fatalf("delete of a missing queue: exit %d, %q, %q", code, out, errOut)
	}

	// Declare sends only the flags given; update the same, by PATCH.
	code, out, errOut = cs.run("admin", "queue", "declare", "--topic", "or ders", "--partitions", "2", "--max-retries", "0")
	if r := cs.last(); code != 0 || r.method != "PUT" || r.body != `{"partitions":2,"max_retries":0}` || !strings.HasPrefix(out, "created queue") {
		t.Fatalf("declare: exit %d %s, %q, %+v", code, errOut, out, r)
	}
	code, _, errOut = cs.run("admin", "queue", "update", "--topic", "or ders", "--lease-ms", "5000", "--dead-letter-mode", "queue", "--dead-letter-target", "dead")
	if r := cs.last(); code != 0 || r.method != "PATCH" || r.body != `{"dead_letter_mode":"queue","dead_letter_target":"dead","lease_ms":5000}` {
		t.Fatalf("update: exit %d %s, %+v", code, errOut, r)
	}
}

func TestAdminMessagesPeekContract(t *testing.T) {
	body := "\x00\xffpay\nload"
	page := func(p int) string {
		return `{"topic": "or ders", "group": "", "partition": ` + jsonNum(uint64(p)) + `, "from": 0, "next": 43, "next_offset": 120,
 "messages": [{"offset": 42, "state": "inflight", "attempt": 2, "published_at_ms": 1790000000000, "content_type": "application/octet-stream",
  "key_b64": "` + b64("k\x01") + `", "headers": [{"key": "a", "value": "b"}, {"key": "bin", "value_b64": "` + b64("\xfe") + `"}],
  "body_bytes": 5000, "body_b64": "` + b64(body) + `", "body_truncated": true},
  {"offset": 44, "state": "ready", "attempt": 0, "published_at_ms": 1790000000000, "headers": [], "body_bytes": 9,
   "body_b64": "", "body_truncated": true, "error": "segment 3: checksum mismatch"}]}`
	}
	cs := newContractServer(t, map[string]route{
		"GET /api/v1/queues/or%20ders":          {200, contractQueue},
		"GET /api/v1/queues/or%20ders/messages": {200, page(0)},
	})
	code, out, errOut := cs.run("admin", "messages", "peek", "--topic", "or ders", "--partition", "1", "--from", "40", "--limit", "5", "--preview-bytes", "9")
	if r := cs.last(); code != 0 || r.query != "from=40&limit=5&partition=1&preview_bytes=9" {
		t.Fatalf("peek: exit %d %s, %+v", code, errOut, cs.last())
	}
	for _, want := range []string{
		"--- offset 42  state inflight  attempt 2  published 2026-09-21T",
		`key: "k\x01"`, "content-type: application/octet-stream", "header a: b", `header bin: "\xfe"`,
		`body (5000 bytes, first 10 shown): "\x00\xffpay\nload"`, "(more: --partition 0 --from 43)",
		"--- offset 44  state ready  attempt 0", "body (9 bytes): could not be read: segment 3: checksum mismatch\n",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("peek output lacks %q:\n%s", want, out)
		}
	}
	// Every partition: the queue is read for its partition count first.
	code, out, _ = cs.run("admin", "messages", "peek", "--topic", "or ders", "--json")
	var all struct {
		Pages []apiMessages `json:"pages"`
	}
	if err := json.Unmarshal([]byte(out), &all); code != 0 || err != nil || len(all.Pages) != 2 || all.Pages[0].Messages[0].BodyB64 != b64(body) {
		t.Fatalf("peek all --json: exit %d, %q, %v", code, out, err)
	}
	code, out, _ = cs.run("admin", "messages", "peek", "--topic", "or ders", "--partition", "0", "--body", "base64")
	if code != 0 || !strings.Contains(out, "first 10 shown): "+b64(body)+"\n") {
		t.Fatalf("peek --body base64:\n%s", out)
	}
}

func TestAdminDLQContract(t *testing.T) {
	dl := `{"topic": "sinew.dlq", "dead_letters": [
  {"partition": 0, "offset": 7, "reason": "retries_exhausted", "source_topic": "orders", "source_group": "", "source_partition": 1, "source_offset": 42,
   "retries": 3, "dead_lettered_at_ms": 1790000000000,
   "message": {"offset": 7, "state": "ready", "attempt": 0, "published_at_ms": 1790000000000, "headers": [{"key": "sinew.reason", "value": "retries_exhausted"}],
    "body_bytes": 3, "body_b64": "` + b64("a\tb") + `", "body_truncated": false}}],
 "next_cursor": "c2"}`
	replay := `{"results": [
  {"partition": 0, "offset": 7, "status": "replayed", "error": "", "target_topic": "orders", "target_group": "", "target_partition": 1, "target_offset": 130, "removed": true},
  {"partition": 0, "offset": 9, "status": "not_found", "error": "no dead letter at 0:9", "removed": false}]}`
	cs := newContractServer(t, map[string]route{
		"GET /api/v1/deadletters":         {200, dl},
		"POST /api/v1/deadletters/replay": {200, replay},
	})
	code, out, errOut := cs.run("admin", "dlq", "list", "--cursor", "c1", "--limit", "1")
	if r := cs.last(); code != 0 || r.query != "cursor=c1&limit=1&preview_bytes=64" {
		t.Fatalf("dlq list: exit %d %s, %+v", code, errOut, r)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[1]), " ") != `0:7 retries_exhausted orders/(default) 1:42 3 2026-09-21T14:13:20.000Z "a\tb"` ||
		lines[2] != "(more: --cursor c2)" {
		t.Fatalf("dlq list:\n%s", out)
	}
	code, out, _ = cs.run("admin", "dlq", "list", "--long")
	if code != 0 || !strings.Contains(out, "--- 0:7  state ready") || !strings.Contains(out, "dead-lettered: retries_exhausted at 2026-09-21T14:13:20.000Z after 3 retries, from queue \"orders\" group \"\" partition 1 offset 42") {
		t.Fatalf("dlq list --long:\n%s", out)
	}

	// One of two not replayed: every outcome is shown, and the exit is 1.
	code, out, errOut = cs.run("admin", "dlq", "replay", "0:7", "--keep", "0:9")
	if r := cs.last(); r.body != `{"items":[{"partition":0,"offset":7},{"partition":0,"offset":9}],"keep":true}` {
		t.Fatalf("replay request %+v", r)
	}
	if code != 1 || !strings.Contains(out, "orders/(default) 1:130") || !strings.Contains(out, "no dead letter at 0:9") ||
		!strings.Contains(errOut, "not every dead letter was replayed: 1 of 2") {
		t.Fatalf("replay: exit %d, %q, %q", code, out, errOut)
	}
}

func TestAdminSessionsOverviewDrainContract(t *testing.T) {
	cs := newContractServer(t, map[string]route{
		"GET /api/v1/sessions": {200, `{"sessions": [
  {"client_id": "c-1", "state": "attached", "conn_id": 17, "grace_left_ms": null, "inflight": 2, "pending": 0,
   "subscriptions": [{"sub_id": 1, "topic": "orders", "group": "", "partition": -1, "prefetch": 256, "inflight": 2}]},
  {"client_id": "c-2", "state": "dormant", "conn_id": 0, "grace_left_ms": 4200, "inflight": 1, "pending": 3,
   "subscriptions": [{"sub_id": 2, "topic": "t", "group": "g", "partition": 3, "prefetch": 8, "auto_ack": true, "inflight": 0}]}]}`},
		"GET /api/v1/connections": {200, `{"connections": [{"conn_id": 17, "remote_addr": "127.0.0.1:53122", "client_id": "c-1", "connected_at_ms": 1790000000000, "subscriptions": 1}]}`},
		"GET /api/v1/overview": {200, `{"version": "sinew/0.1", "api": "v1", "owner_id": "b-1", "generation": 4, "started_at_ms": 1790000000000,
  "uptime_ms": 3723000, "ready": false, "problems": ["orders/0: quarantined"], "draining": false, "queues": 3, "partitions": 12,
  "totals": {"ready": 10, "bytes_on_disk": 2048}, "counters": {"publishes": 7}, "dead_lettered_by_reason": {"failed": 1}}`},
		"GET /api/v1/version": {200, `{"version": "sinew/0.1", "api": "v1"}`},
		"POST /api/v1/drain":  {501, `{"code": "not_implemented", "error": "drain is not in this build"}`},
	})
	code, out, errOut := cs.run("admin", "sessions")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || strings.Join(strings.Fields(lines[1]), " ") != "c-1 attached 17 - 2 0 orders/(default)(prefetch 256, inflight 2)" ||
		strings.Join(strings.Fields(lines[2]), " ") != "c-2 dormant - 4.2s 1 3 t/g[partition 3](prefetch 8, inflight 0, auto-ack)" {
		t.Fatalf("sessions: exit %d, %q\n%s", code, errOut, out)
	}
	code, out, _ = cs.run("admin", "connections")
	if code != 0 || !strings.Contains(out, "127.0.0.1:53122") {
		t.Fatalf("connections:\n%s", out)
	}
	code, out, _ = cs.run("admin", "overview")
	for _, want := range []string{"sinew/0.1 (api v1)", "1h2m3s", "no: orders/0: quarantined", "3 (12 partitions)", "2.0 KiB", "publishes (total)", "dead_lettered failed (total)"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("overview lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = cs.run("admin", "version")
	if code != 0 || !strings.HasPrefix(out, "cli:    sinew 0.1 (") || !strings.HasSuffix(out, "broker: sinew/0.1 (api v1) at "+cs.addr+"\n") {
		t.Fatalf("version: %q", out)
	}
	code, out, errOut = cs.run("admin", "drain")
	if code != 1 || out != "" || !strings.Contains(errOut, "not_implemented (HTTP 501): drain is not in this build") {
		t.Fatalf("drain: exit %d, %q, %q", code, out, errOut)
	}
	// A path the broker does not serve: net/http's 404, said plainly.
	code, _, errOut = cs.run("admin", "dlq", "list")
	if code != 1 || !strings.Contains(errOut, "no such endpoint") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("missing endpoint: exit %d, %q", code, errOut)
	}
}

// TestAdminUsersContract: the user commands send what docs/operations.md
// says, the password only in a request body, and show the documented
// answers; a user name that needs escaping is path-escaped.
func TestAdminUsersContract(t *testing.T) {
	const alice = `{"name": "a.b@c", "permissions": {"publish": ["orders.*"], "consume": [], "manage": []}}`
	cs := newContractServer(t, map[string]route{
		"GET /api/v1/users":                          {200, `{"users": [` + alice + `]}`},
		"GET /api/v1/users/a.b@c":                    {200, alice},
		"POST /api/v1/users":                         {201, alice},
		"PUT /api/v1/users/a.b@c/password":           {200, alice},
		"PATCH /api/v1/users/a.b@c/permissions":      {200, `{"name": "a.b@c", "permissions": {"publish": ["orders.*", "x y"], "consume": [], "manage": []}}`},
		"DELETE /api/v1/users/a.b@c":                 {200, `{"removed": true}`},
		"PATCH /api/v1/users/nobody%2Fx/permissions": {404, `{"code": "not_found", "error": "auth: user not found: \"nobody/x\""}`},
	})
	code, out, errOut := cs.run("admin", "user", "list")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 ||
		strings.Join(strings.Fields(lines[1]), " ") != "a.b@c orders.* - -" {
		t.Fatalf("list: exit %d, %q\n%s", code, errOut, out)
	}
	t.Setenv("SINEW_NEW_PASSWORD", "")
	code, out, errOut = runCmd(t, "pass word 1\n", "admin", "user", "add", "a.b@c", "--publish", "orders.*", "--password-stdin", "--admin-addr", cs.addr)
	r := cs.lastOf("POST")
	if code != 0 || r.method != "POST" || r.path != "/api/v1/users" || r.query != "" ||
		r.body != `{"name":"a.b@c","password":"pass word 1","permissions":{"publish":["orders.*"],"consume":[],"manage":[]}}` ||
		strings.Contains(out+errOut, "pass word") {
		t.Fatalf("add: exit %d, %+v, %q %q", code, r, out, errOut)
	}
	t.Setenv("SINEW_NEW_PASSWORD", "pass word 2")
	code, out, _ = cs.run("admin", "user", "passwd", "a.b@c")
	if r := cs.last(); code != 0 || r.method != "PUT" || r.path != "/api/v1/users/a.b@c/password" || r.body != `{"password":"pass word 2"}` ||
		strings.Contains(out, "pass word") {
		t.Fatalf("passwd: exit %d, %+v, %q", code, r, out)
	}
	t.Setenv("SINEW_NEW_PASSWORD", "")
	// grant is one PATCH: the broker adds the patterns atomically.
	code, out, _ = cs.run("admin", "user", "grant", "a.b@c", "--publish", "x y")
	if r := cs.last(); code != 0 || r.method != "PATCH" || r.path != "/api/v1/users/a.b@c/permissions" ||
		r.body != `{"grant":{"publish":["x y"],"consume":[],"manage":[]},"revoke":{"publish":[],"consume":[],"manage":[]}}` ||
		!strings.Contains(out, "publish orders.* x y;") {
		t.Fatalf("grant: exit %d, %+v, %q", code, r, out)
	}
	code, out, _ = cs.run("admin", "user", "remove", "a.b@c")
	if r := cs.last(); code != 0 || r.method != "DELETE" || r.path != "/api/v1/users/a.b@c" || !strings.Contains(out, "removed user a.b@c") {
		t.Fatalf("remove: exit %d, %+v, %q", code, r, out)
	}
	code, _, errOut = cs.run("admin", "user", "revoke", "nobody/x", "--consume", "t")
	if r := cs.last(); code != 1 || r.path != "/api/v1/users/nobody%2Fx/permissions" || r.body != `{"grant":{"publish":[],"consume":[],"manage":[]},"revoke":{"publish":[],"consume":["t"],"manage":[]}}` || !strings.Contains(errOut, "not_found (HTTP 404): auth: user not found") {
		t.Fatalf("revoke unknown: exit %d, %q", code, errOut)
	}
}
