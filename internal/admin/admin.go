package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sinewmq/sinew/internal/admin/dashboard"
	"github.com/sinewmq/sinew/internal/runtimesettings"
)

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
	// Metrics is what /metrics serves, in the Prometheus text format; nil
	// serves an empty exposition.
	Metrics prometheus.Gatherer
	// Settings is the runtime settings store served at /api/v1/settings;
	// nil serves no such endpoint.
	Settings *runtimesettings.Store
}

// Handler returns the admin HTTP handler.
func Handler(cfg Config) http.Handler {
	mux := http.NewServeMux()
	dashboard.Mount(mux)
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
	var gatherer prometheus.Gatherer = prometheus.NewRegistry()
	if cfg.Metrics != nil {
		gatherer = cfg.Metrics
	}
	// A collector that fails must not hide the others: serve what gathered.
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
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
	if cfg.Settings != nil {
		mux.HandleFunc("GET /api/v1/settings", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, settingsView(cfg.Settings.Snapshot()))
		})
		mux.HandleFunc("PUT /api/v1/settings", func(w http.ResponseWriter, r *http.Request) {
			putSettings(w, r, cfg.Settings)
		})
	}
	return mux
}

// settingsBodyBytesMax bounds a PUT /api/v1/settings body; a handful of keys
// take a few hundred bytes.
const settingsBodyBytesMax = 64 << 10

// SettingsDoc is the JSON of GET /api/v1/settings and of a PUT's answer.
type SettingsDoc struct {
	// Version goes up by one on every accepted change.
	Version uint64 `json:"version"`
	// Values holds every runtime setting.
	Values map[string]int64 `json:"values"`
	// RuntimeKeys describes the keys that are runtime settings, with their
	// ranges. Every other configuration key is a startup setting.
	RuntimeKeys []RuntimeKey `json:"runtime_keys"`
}

// RuntimeKey describes one runtime setting.
type RuntimeKey struct {
	Key         string `json:"key"`
	Min         int64  `json:"min"`
	Max         int64  `json:"max"`
	Description string `json:"description"`
}

// SettingsPut is the body of PUT /api/v1/settings: the version the change is
// based on (the one a GET returned) and the keys to change.
type SettingsPut struct {
	Version *uint64                `json:"version"`
	Values  map[string]json.Number `json:"values"`
}

// SettingsError is the JSON body of a refused PUT. A 409 also carries the
// current version and values, so the caller can retry from them.
type SettingsError struct {
	Error   string           `json:"error"`
	Version uint64           `json:"version,omitempty"`
	Values  map[string]int64 `json:"values,omitempty"`
}

func settingsView(d runtimesettings.Doc) SettingsDoc {
	v := SettingsDoc{Version: d.Version, Values: d.Values}
	for _, k := range runtimesettings.Keys() {
		v.RuntimeKeys = append(v.RuntimeKeys, RuntimeKey{Key: k.Name, Min: k.Min, Max: k.Max, Description: k.Help})
	}
	return v
}

// putSettings applies a change. It answers 200 only once the new document is
// on disk; 400 for a malformed body, an unknown key or a value out of range
// (nothing is changed); 409 when the version is not the current one; 500 when
// the document could not be written (the old one stays in force).
func putSettings(w http.ResponseWriter, r *http.Request, st *runtimesettings.Store) {
	bad := func(format string, args ...any) {
		writeJSON(w, http.StatusBadRequest, SettingsError{Error: fmt.Sprintf(format, args...)})
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, settingsBodyBytesMax))
	if err != nil {
		bad("read body: %v", err)
		return
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var req SettingsPut
	if err := dec.Decode(&req); err != nil {
		bad("body is not a settings change ({\"version\": N, \"values\": {\"key\": N}}): %v", err)
		return
	}
	if dec.More() {
		bad("body has data after the settings change")
		return
	}
	if req.Version == nil {
		bad("version is required: the version this change is based on, as GET /api/v1/settings reports it")
		return
	}
	changes := make(map[string]int64, len(req.Values))
	for k, n := range req.Values {
		v, err := n.Int64()
		if err != nil {
			bad("%s: %s is not an integer", k, n.String())
			return
		}
		changes[k] = v
	}
	d, err := st.Update(*req.Version, changes)
	var conflict *runtimesettings.ConflictError
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, settingsView(d))
	case errors.As(err, &conflict):
		writeJSON(w, http.StatusConflict, SettingsError{Error: err.Error(), Version: conflict.Current.Version, Values: conflict.Current.Values})
	case errors.Is(err, runtimesettings.ErrUnknownKey), errors.Is(err, runtimesettings.ErrOutOfRange), errors.Is(err, runtimesettings.ErrNoChange):
		bad("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	default:
		writeJSON(w, http.StatusInternalServerError, SettingsError{Error: err.Error()})
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(data, '\n'))
}
