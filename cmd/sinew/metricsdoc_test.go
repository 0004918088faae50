package main

import (
	"os"
	"strings"
	"testing"
)

// operationsDoc is where every metric is documented.
const operationsDoc = "../../docs/operations.md"

// docMetricRows returns the metric names of the table under the
// "## Metrics" heading of docs/operations.md: every row whose first cell is
// a `sinew_` name.
func docMetricRows(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Metrics")
	if !ok {
		t.Fatalf("%s has no \"## Metrics\" section", operationsDoc)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var names []string
	for _, line := range strings.Split(section, "\n") {
		if rest, ok := strings.CutPrefix(line, "| `sinew_"); ok {
			name, _, _ := strings.Cut(rest, "`")
			names = append(names, "sinew_"+name)
		}
	}
	return names
}

// The metric table in docs/operations.md lists exactly the sinew_* families
// /metrics can serve, each once.
func TestMetricsDocInStep(t *testing.T) {
	doc := map[string]int{}
	for _, n := range docMetricRows(t) {
		doc[n]++
	}
	code := map[string]bool{}
	for _, f := range sinewFamilies() {
		code[f.name] = true
		if doc[f.name] == 0 {
			t.Errorf("%s is served but not documented in %s", f.name, operationsDoc)
		}
	}
	for n, k := range doc {
		if !code[n] {
			t.Errorf("%s is documented in %s but not served", n, operationsDoc)
		}
		if k > 1 {
			t.Errorf("%s is documented %d times", n, k)
		}
	}
}
