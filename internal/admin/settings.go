package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/sinewmq/sinew/internal/runtimesettings"
)

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
	Code    string           `json:"code"`
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
// (nothing is changed); 409 when the version is not the current one; 503 in
// a cluster when the controller did not commit the change in time (it may
// still apply); 500 when the document could not be written (the old one
// stays in force).
func putSettings(w http.ResponseWriter, r *http.Request, st *runtimesettings.Store) {
	bad := func(format string, args ...any) {
		writeJSON(w, http.StatusBadRequest, SettingsError{Code: "bad_request", Error: fmt.Sprintf(format, args...)})
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
		writeJSON(w, http.StatusConflict, SettingsError{Code: "conflict", Error: err.Error(), Version: conflict.Current.Version, Values: conflict.Current.Values})
	case errors.Is(err, runtimesettings.ErrUnknownKey), errors.Is(err, runtimesettings.ErrOutOfRange), errors.Is(err, runtimesettings.ErrNoChange):
		bad("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	case errors.Is(err, runtimesettings.ErrNotCommitted):
		writeJSON(w, http.StatusServiceUnavailable, SettingsError{Code: "unavailable", Error: err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, SettingsError{Code: "internal", Error: err.Error()})
	}
}
