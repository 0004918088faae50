package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sinewmq/sinew/protocol"
)

// Every broker error is answered with the status its code calls for and
// the code's name: another node's answer (not_owner, naming where the
// partition is served, or fenced) is a retryable 503, never 500; only
// internal, or an error carrying no code, is 500.
func TestBrokerErrorStatus(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		code   string
		owner  string
	}{
		{&protocol.Error{Code: protocol.CodeNotOwner, Owner: "node2:7654", Message: "served by node2:7654"}, 503, "not_owner", "node2:7654"},
		{fmt.Errorf("wrapped: %w", &protocol.Error{Code: protocol.CodeNotOwner, Owner: "n:1"}), 503, "not_owner", "n:1"},
		{protocol.Errorf(protocol.CodeFenced, "cut off"), 503, "fenced", ""},
		{protocol.Errorf(protocol.CodeUnavailable, "election"), 503, "unavailable", ""},
		{protocol.Errorf(protocol.CodeShuttingDown, "bye"), 503, "shutting_down", ""},
		{protocol.Errorf(protocol.CodeResourceExhausted, "full"), 503, "resource_exhausted", ""},
		{protocol.Errorf(protocol.CodeNotFound, "none"), 404, "not_found", ""},
		{protocol.Errorf(protocol.CodeConflict, "partitions"), 409, "conflict", ""},
		{protocol.Errorf(protocol.CodePermissionDenied, "no"), 403, "permission_denied", ""},
		{protocol.Errorf(protocol.CodeBadRequest, "bad"), 400, "bad_request", ""},
		{protocol.Errorf(protocol.CodeLimitExceeded, "big"), 400, "limit_exceeded", ""},
		{protocol.Errorf(protocol.CodeInternal, "disk"), 500, "internal", ""},
		{errors.New("no code"), 500, "internal", ""},
	} {
		rec := httptest.NewRecorder()
		writeBrokerError(rec, c.err)
		var e ErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
			t.Fatalf("%v: %v", c.err, err)
		}
		if rec.Code != c.status || e.Code != c.code || e.Owner != c.owner || e.Error == "" {
			t.Errorf("%v: %d %+v, want %d %s owner %q", c.err, rec.Code, e, c.status, c.code, c.owner)
		}
	}
	for _, code := range protocol.Codes() {
		if code == protocol.CodeOK {
			continue
		}
		if s := brokerStatus(code); s == http.StatusInternalServerError && code != protocol.CodeInternal {
			t.Errorf("code %s is answered 500", code)
		}
	}
}
