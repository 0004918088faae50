package admin

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

// A body the API cannot take is refused with what is wrong in the API's
// terms: the field, the value given and what the field takes; never the
// decoder's Go type and struct names.
func TestBadBodyNamesTheFieldNotTheGoType(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"partitions": -3}`, `body: field "partitions": a number -3 where it takes a whole number from 0 to 4294967295`},
		{`{"partitions": "a"}`, `body: field "partitions": a string where it takes a whole number from 0 to 4294967295`},
		{`{"max_retries": 9999999999}`, `body: field "max_retries": a number 9999999999 where it takes a whole number from -2147483648 to 2147483647`},
		{`{"dead_letter_mode": 1}`, `body: field "dead_letter_mode": a number where it takes a string`},
		{`{"bogus": 1}`, `body: unknown field "bogus"`},
		{`{"partitions": 2`, `body: the JSON ends early`},
		{`[1]`, `body: the body is a JSON array; it takes an object`},
		{`{"partitions": 2,}`, `body: not valid JSON at byte 18`},
		{`{"partitions": 2} {}`, `body has data after the JSON value`},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("PUT", "/api/v1/queues/t", strings.NewReader(tc.body))
		var q QueueDeclare
		if decodeBody(w, r, &q, false) {
			t.Errorf("%s: accepted", tc.body)
			continue
		}
		var e struct{ Code, Error string }
		if w.Code != 400 || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Code != "bad_request" || !strings.HasPrefix(e.Error, tc.want) {
			t.Errorf("%s: %d %s, want 400 bad_request %q", tc.body, w.Code, w.Body.String(), tc.want)
		}
		if strings.Contains(e.Error, "Go struct") || strings.Contains(e.Error, "uint32") {
			t.Errorf("%s: the answer names Go types: %s", tc.body, e.Error)
		}
	}
}
