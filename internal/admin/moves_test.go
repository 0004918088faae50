package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/protocol"
)

func moveDo(t *testing.T, h http.Handler, method, path, body string) (int, ErrorBody, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	h.ServeHTTP(rec, httptest.NewRequest(method, path, rd))
	out, _ := io.ReadAll(rec.Result().Body)
	var e ErrorBody
	_ = json.Unmarshal(out, &e)
	return rec.Code, e, string(out)
}

// TestMovesOnANodeAlone: a node that runs alone lists no moves and refuses
// to start or cancel one with 409 not_clustered.
func TestMovesOnANodeAlone(t *testing.T) {
	h := Handler(Config{})
	code, _, body := moveDo(t, h, "GET", "/api/v1/moves", "")
	var v MovesView
	if code != 200 || json.Unmarshal([]byte(body), &v) != nil || v.Cluster || v.Moves == nil || len(v.Moves) != 0 {
		t.Fatalf("GET moves alone: %d %s", code, body)
	}
	if code, e, body := moveDo(t, h, "POST", "/api/v1/moves", `{"topic":"t","to":"n"}`); code != 409 || e.Code != "not_clustered" {
		t.Fatalf("POST moves alone: %d %s", code, body)
	}
	if code, e, body := moveDo(t, h, "POST", "/api/v1/moves/3/cancel", ""); code != 409 || e.Code != "not_clustered" {
		t.Fatalf("cancel alone: %d %s", code, body)
	}
	if code, e, body := moveDo(t, h, "GET", "/api/v1/moves/3", ""); code != 404 || e.Code != "unknown_move" {
		t.Fatalf("GET a move alone: %d %s", code, body)
	}
	if code, e, body := moveDo(t, h, "POST", "/api/v1/moves/unpin", `{"topic":"t"}`); code != 409 || e.Code != "not_clustered" {
		t.Fatalf("unpin alone: %d %s", code, body)
	}
	if !strings.Contains(body, `"pinned": []`) {
		t.Fatalf("GET moves alone lists no pinned queues as []: %s", body)
	}
}

// TestUnpinRequests: an unpin names a topic; the cluster's refusal is
// answered with its code.
func TestUnpinRequests(t *testing.T) {
	var got [2]string
	var answer error
	h := Handler(Config{UnpinQueue: func(_ context.Context, topic, group string) error {
		got = [2]string{topic, group}
		return answer
	}})
	for _, body := range []string{"", `{"group":"g"}`, `{"topic":"t","x":1}`} {
		if code, e, out := moveDo(t, h, "POST", "/api/v1/moves/unpin", body); code != 400 || e.Code != "bad_request" {
			t.Errorf("unpin %q: %d %s, want 400 bad_request", body, code, out)
		}
	}
	if code, _, out := moveDo(t, h, "POST", "/api/v1/moves/unpin", `{"topic":"t","group":"g"}`); code != 200 || got != [2]string{"t", "g"} || !strings.Contains(out, `"pinned": false`) {
		t.Fatalf("unpin: %d %s (asked %v)", code, out, got)
	}
	answer = &Error{Status: 404, Code: "not_found", Msg: "no queue"}
	if code, e, out := moveDo(t, h, "POST", "/api/v1/moves/unpin", `{"topic":"t"}`); code != 404 || e.Code != "not_found" {
		t.Fatalf("unpin of an unknown queue: %d %s", code, out)
	}
}

// TestMoveRequests: bad bodies and ids are 400 bad_request before the
// cluster is asked; an *Error the cluster returns is answered with its
// status and code; a wait that ends is 503.
func TestMoveRequests(t *testing.T) {
	var got MoveRequest
	var answer error
	h := Handler(Config{
		Moves: func(context.Context) MovesView {
			return MovesView{Cluster: true, Moves: []MoveView{{ID: 7, Topic: "t", State: "catching_up", Cancellable: true}}}
		},
		StartMove: func(_ context.Context, r MoveRequest) (MoveView, error) {
			got = r
			return MoveView{ID: 9, Topic: r.Topic, State: "catching_up"}, answer
		},
		CancelMove: func(_ context.Context, id uint64, reason string) (MoveView, error) {
			return MoveView{ID: id, State: "cancelled", Reason: reason}, answer
		},
	})
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/api/v1/moves", ""},
		{"POST", "/api/v1/moves", `{"to":"n"}`},
		{"POST", "/api/v1/moves", `{"topic":"t"}`},
		{"POST", "/api/v1/moves", `{"topic":"t","to":"n","partition":-1}`},
		{"POST", "/api/v1/moves", `{"topic":"t","to":"n","extra":1}`},
		{"POST", "/api/v1/moves", `{"topic":"t","to":"n"} {}`},
		{"POST", "/api/v1/moves/0/cancel", ""},
		{"POST", "/api/v1/moves/x/cancel", ""},
		{"POST", "/api/v1/moves/1/cancel", `{"reason":"` + strings.Repeat("r", 300) + `"}`},
		{"GET", "/api/v1/moves/-1", ""},
	} {
		if code, e, body := moveDo(t, h, tc.method, tc.path, tc.body); code != 400 || e.Code != "bad_request" || e.Error == "" {
			t.Errorf("%s %s %q: %d %s, want 400 bad_request", tc.method, tc.path, tc.body, code, body)
		}
	}
	code, _, body := moveDo(t, h, "POST", "/api/v1/moves", `{"topic":"t","group":"g","partition":0,"from":"a","to":"b"}`)
	if code != 202 || got.Topic != "t" || got.Group != "g" || got.Partition == nil || *got.Partition != 0 || got.From != "a" || got.To != "b" {
		t.Fatalf("POST a move: %d %s, request %+v", code, body, got)
	}
	if code, _, body := moveDo(t, h, "GET", "/api/v1/moves/7", ""); code != 200 || !strings.Contains(body, `"cancellable": true`) {
		t.Fatalf("GET move 7: %d %s", code, body)
	}
	if code, _, body := moveDo(t, h, "POST", "/api/v1/moves/7/cancel", `{"reason":"why"}`); code != 200 || !strings.Contains(body, `"reason": "why"`) {
		t.Fatalf("cancel move 7: %d %s", code, body)
	}
	answer = &Error{Status: 409, Code: "cut_over_started", Msg: "too late"}
	if code, e, body := moveDo(t, h, "POST", "/api/v1/moves/7/cancel", ""); code != 409 || e.Code != "cut_over_started" || e.Error != "too late" {
		t.Fatalf("a refused cancel: %d %s", code, body)
	}
	answer = context.DeadlineExceeded
	if code, e, body := moveDo(t, h, "POST", "/api/v1/moves", `{"topic":"t","to":"n"}`); code != 503 || e.Code != "unavailable" {
		t.Fatalf("a start that timed out: %d %s", code, body)
	}
	answer = protocol.Errorf(protocol.CodeFenced, "cut off")
	if code, e, body := moveDo(t, h, "POST", "/api/v1/moves", `{"topic":"t","to":"n"}`); code != 503 || e.Code != "fenced" {
		t.Fatalf("a start refused by a fenced node: %d %s", code, body)
	}
	answer = errors.New("disk on fire")
	if code, e, body := moveDo(t, h, "POST", "/api/v1/moves", `{"topic":"t","to":"n"}`); code != 500 || e.Code != "internal" {
		t.Fatalf("a start that failed: %d %s", code, body)
	}
}
