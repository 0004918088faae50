package main

import (
	"encoding/json"
	"strings"
	"testing"
)

const contractCohort = `{"topic": "or ders", "group": "", "cohort": "billing", "members": ["m1", "m\u0000x"], "planner": "local",
 "generation": 3, "owners": ["m1", "m\u0000x"], "paused": 1, "lag": 9,
 "partitions": [
  {"partition": 0, "planned": "m1", "held": true, "member": "m1", "epoch": 4, "paused": false, "lag": 7, "owned": true},
  {"partition": 1, "planned": "m\u0000x", "held": true, "member": "m1", "epoch": 2, "paused": true, "lag": 2, "owned": false, "owner": "10.0.0.2:7654"}]}`

// TestAdminCohortsContract: admin cohorts sends GET /api/v1/cohorts, or the
// queue's path with --topic (and its group), and shows the documented
// answer: a line per cohort, then its partitions; names that need it are
// escaped; --json prints the answer.
func TestAdminCohortsContract(t *testing.T) {
	cs := newContractServer(t, map[string]route{
		"GET /api/v1/cohorts":           {200, `{"cohorts": [` + contractCohort + `]}`},
		"GET /api/v1/cohorts/or%20ders": {200, `{"cohorts": [` + contractCohort + `]}`},
		"GET /api/v1/cohorts/empty":     {200, `{"cohorts": []}`},
		"GET /api/v1/cohorts/gone":      {404, `{"code": "not_found", "error": "queue \"gone\" group \"\" does not exist"}`},
	})
	code, out, errOut := cs.run("admin", "cohorts")
	if r := cs.last(); code != 0 || r.method != "GET" || r.path != "/api/v1/cohorts" || r.query != "" {
		t.Fatalf("cohorts: exit %d %s, request %+v", code, errOut, r)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{
		"TOPIC GROUP COHORT PLANNER GENERATION MEMBERS PAUSED LAG",
		`or ders (default) billing local 3 m1,"m\x00x" 1/2 9`,
		"",
		`queue "or ders" group "" cohort "billing":`,
		"PARTITION MEMBER EPOCH LAG PAUSED PLANNED OWNER",
		"0 m1 4 7 false m1 here",
		`1 m1 2 2 true "m\x00x" 10.0.0.2:7654`,
	}
	if len(lines) != len(want) {
		t.Fatalf("cohorts table:\n%s", out)
	}
	for i := range want {
		if got := strings.Join(strings.Fields(lines[i]), " "); got != want[i] {
			t.Fatalf("cohorts line %d: %q, want %q\n%s", i, got, want[i], out)
		}
	}

	code, out, _ = cs.run("admin", "cohorts", "--json")
	var got apiCohorts
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got.Cohorts) != 1 || got.Cohorts[0].Partitions[1].Owner != "10.0.0.2:7654" {
		t.Fatalf("cohorts --json: %q %v", out, err)
	}

	code, _, errOut = cs.run("admin", "cohorts", "--topic", "or ders", "--group", "g/1")
	if r := cs.last(); r.path != "/api/v1/cohorts/or%20ders" || r.query != "group=g%2F1" {
		t.Fatalf("cohorts --topic: exit %d %s, request %+v", code, errOut, r)
	}
	code, out, errOut = cs.run("admin", "cohorts", "--topic", "empty")
	if code != 0 || out != "" || errOut != "no cohorts\n" {
		t.Fatalf("no cohorts: exit %d, %q, %q", code, out, errOut)
	}
	code, _, errOut = cs.run("admin", "cohorts", "--topic", "gone")
	if code != 1 || !strings.Contains(errOut, "not_found (HTTP 404)") {
		t.Fatalf("a missing queue: exit %d, %q", code, errOut)
	}
	if code, _, errOut = cs.run("admin", "cohorts", "--group", "g"); code != 2 || !strings.Contains(errOut, "--group needs --topic") {
		t.Fatalf("--group alone: exit %d, %q", code, errOut)
	}
}
