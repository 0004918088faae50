package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// Metric is one sample. Samples with the same Name form one metric family and must
// share Help and Type.
type Metric struct {
	Name   string
	Help   string
	Type   string      // "counter" or "gauge"
	Labels [][2]string // name, value
	Value  float64
}

// Config wires the handler to its data.
type Config struct {
	// Ready reports whether the broker has recovered and serves.
	Ready func() bool
	// Problems lists what keeps a serving broker from being fully ready,
	// one line each (a quarantined or failed partition and why); nil or
	// empty when there is nothing.
	Problems func() []string
	// Queues returns the value served as JSON by /api/v1/queues.
	Queues func() any
	// Metrics returns the samples for /metrics, grouped by name.
	Metrics func() []Metric
}

// Handler returns the admin HTTP handler.
func Handler(cfg Config) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if cfg.Ready == nil || !cfg.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "not ready\n")
			return
		}
		var problems []string
		if cfg.Problems != nil {
			problems = cfg.Problems()
		}
		if len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			var b strings.Builder
			fmt.Fprintf(&b, "not ready: %d problem(s)\n", len(problems))
			for _, p := range problems {
				b.WriteString(strings.ReplaceAll(p, "\n", " ") + "\n")
			}
			io.WriteString(w, b.String())
			return
		}
		io.WriteString(w, "ready\n")
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		var ms []Metric
		if cfg.Metrics != nil {
			ms = cfg.Metrics()
		}
		WriteMetrics(w, ms)
	})
	mux.HandleFunc("GET /api/v1/queues", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var v any = []any{}
		if cfg.Queues != nil {
			v = cfg.Queues()
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	return mux
}

// WriteMetrics writes ms in the Prometheus text format. Families appear in the
// order of their first sample.
func WriteMetrics(w io.Writer, ms []Metric) error {
	var order []string
	byName := map[string][]Metric{}
	for _, m := range ms {
		if _, seen := byName[m.Name]; !seen {
			order = append(order, m.Name)
		}
		byName[m.Name] = append(byName[m.Name], m)
	}
	var b strings.Builder
	for _, name := range order {
		fam := byName[name]
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, escapeHelp(fam[0].Help), name, fam[0].Type)
		for _, m := range fam {
			b.WriteString(name)
			if len(m.Labels) > 0 {
				b.WriteByte('{')
				for i, l := range m.Labels {
					if i > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, "%s=\"%s\"", l[0], escapeLabel(l[1]))
				}
				b.WriteByte('}')
			}
			b.WriteByte(' ')
			b.WriteString(formatValue(m.Value))
			b.WriteByte('\n')
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func escapeHelp(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`).Replace(s)
}

func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
