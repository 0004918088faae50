package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sinewmq/sinew/internal/admin/dashboard"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/runtimesettings"
	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/protocol"
)

// APIVersion is the version segment of every API path.
const APIVersion = "v1"

// requestTimeoutMs bounds how long one API request waits for the broker
// (a partition actor answering a peek, a purge or replay becoming durable).
const requestTimeoutMs = 10_000

// Config wires the handler to its data.
type Config struct {
	// Ready reports whether the broker has recovered and serves.
	Ready func() bool
	// Problems lists what keeps a serving broker from being fully ready,
	// one line each (a quarantined or failed partition and why); nil or
	// empty when there is nothing.
	Problems func() []string
	// Metrics is what /metrics serves, in the Prometheus text format; nil
	// serves an empty exposition.
	Metrics prometheus.Gatherer
	// Settings is the runtime settings store served at /api/v1/settings;
	// nil serves no such endpoint.
	Settings *runtimesettings.Store

	// Broker serves the queue, message and dead-letter endpoints; nil
	// answers them 503.
	Broker *broker.Broker
	// Server serves the connection and session endpoints and the
	// protocol counters of the overview; nil lists none.
	Server *server.Server
	// Version is the broker's version string (as in HELLO_OK).
	Version string
	// OwnerID is the broker's stable identity.
	OwnerID string
	// StartedAt is when the process started; Now reads the clock (default
	// time.Now).
	StartedAt time.Time
	Now       func() time.Time
	// Drain starts the planned drain; nil answers POST /api/v1/drain with
	// 501 not_implemented.
	Drain func(ctx context.Context) error
	// Nodes reports the node's cluster membership for GET /api/v1/nodes;
	// nil reports a node that runs alone.
	Nodes func() NodesView
	// LeaveCluster makes the node leave its cluster and then drain, for
	// POST /api/v1/nodes/self/leave; nil answers 409 conflict.
	LeaveCluster func(ctx context.Context) error
	// UserAddCheck, when set, is asked before a user is added: an error
	// refuses the add (409 conflict, with its text). A cluster node that
	// runs without the gossip key or peer TLS sets it, since a user would
	// make its next start refuse (users need both in a cluster).
	UserAddCheck func() error
	// ForgetNode records a dead node as left, here and on every alive
	// node, for POST /api/v1/nodes/{id}/forget; nil answers 409 conflict.
	// An error wrapping membership.ErrNotDead is a 409 too.
	ForgetNode func(id string) error
	// Moves lists the operator moves for GET /api/v1/moves; StartMove
	// and CancelMove start and cancel one (moves.go). An *Error they
	// return is answered with its status and code. Nil: a node that runs
	// alone (no moves; starting one is 409 not_clustered).
	Moves      func(ctx context.Context) MovesView
	StartMove  func(ctx context.Context, r MoveRequest) (MoveView, error)
	CancelMove func(ctx context.Context, id uint64, reason string) (MoveView, error)
	// UnpinQueue hands a queue an operator moved back to the rebalancer
	// (POST /api/v1/moves/unpin); nil: 409 not_clustered.
	UnpinQueue func(ctx context.Context, topic, group string) error
}

// Handler returns the admin HTTP handler.
func Handler(cfg Config) http.Handler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &api{cfg: cfg}
	mux := http.NewServeMux()
	dashboard.Mount(mux)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if cfg.Ready == nil || !cfg.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "not ready\n")
			return
		}
		problems := a.problems()
		if len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			var b strings.Builder
			fmt.Fprintf(&b, "not ready: %d problem(s)\n", len(problems))
			if problemsHidden(r.Context()) {
				// They name queues; an authenticated GET /api/v1/overview
				// lists them.
				problems = nil
			}
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

	mux.HandleFunc("GET /api/v1/version", a.version)
	mux.HandleFunc("GET /api/v1/overview", a.overview)
	mux.HandleFunc("GET /api/v1/queues", a.needBroker(a.listQueues))
	mux.HandleFunc("GET /api/v1/queues/{topic}", a.needBroker(a.getQueue))
	mux.HandleFunc("PUT /api/v1/queues/{topic}", a.needBroker(a.declareQueue))
	mux.HandleFunc("PATCH /api/v1/queues/{topic}", a.needBroker(a.patchQueue))
	mux.HandleFunc("DELETE /api/v1/queues/{topic}", a.needBroker(a.deleteQueue))
	mux.HandleFunc("POST /api/v1/queues/{topic}/purge", a.needBroker(a.purgeQueue))
	mux.HandleFunc("GET /api/v1/queues/{topic}/messages", a.needBroker(a.messages))
	mux.HandleFunc("GET /api/v1/cohorts", a.needBroker(a.listCohorts))
	mux.HandleFunc("GET /api/v1/cohorts/{topic}", a.needBroker(a.queueCohorts))
	mux.HandleFunc("GET /api/v1/deadletters", a.needBroker(a.deadLetters))
	mux.HandleFunc("POST /api/v1/deadletters/replay", a.needBroker(a.replay))
	mux.HandleFunc("GET /api/v1/connections", a.connections)
	mux.HandleFunc("GET /api/v1/sessions", a.sessions)
	mux.HandleFunc("POST /api/v1/drain", a.drain)
	mux.HandleFunc("GET /api/v1/nodes", a.nodes)
	mux.HandleFunc("POST /api/v1/nodes/self/leave", a.leave)
	mux.HandleFunc("POST /api/v1/nodes/{id}/forget", a.forget)
	mux.HandleFunc("GET /api/v1/moves", a.listMoves)
	mux.HandleFunc("POST /api/v1/moves", a.startMove)
	mux.HandleFunc("GET /api/v1/moves/{id}", a.getMove)
	mux.HandleFunc("POST /api/v1/moves/{id}/cancel", a.cancelMove)
	mux.HandleFunc("POST /api/v1/moves/unpin", a.unpinQueue)
	mux.HandleFunc("GET /api/v1/users", a.needBroker(a.listUsers))
	mux.HandleFunc("POST /api/v1/users", a.needBroker(a.addUser))
	mux.HandleFunc("GET /api/v1/users/{name}", a.needBroker(a.getUser))
	mux.HandleFunc("DELETE /api/v1/users/{name}", a.needBroker(a.removeUser))
	mux.HandleFunc("PUT /api/v1/users/{name}/password", a.needBroker(a.setPassword))
	mux.HandleFunc("PUT /api/v1/users/{name}/permissions", a.needBroker(a.setPermissions))
	mux.HandleFunc("PATCH /api/v1/users/{name}/permissions", a.needBroker(a.patchPermissions))
	if cfg.Settings != nil {
		mux.HandleFunc("GET /api/v1/settings", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, settingsView(cfg.Settings.Snapshot()))
		})
		mux.HandleFunc("PUT /api/v1/settings", func(w http.ResponseWriter, r *http.Request) {
			putSettings(w, r, cfg.Settings)
		})
	}
	// Anything else under /api/ answers with the JSON error body: 405
	// when the path is served with other methods, 404 otherwise.
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		var allowed []string
		for _, m := range []string{"GET", "PUT", "PATCH", "POST", "DELETE"} {
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, pattern := mux.Handler(probe); pattern != "/api/" {
				allowed = append(allowed, m)
			}
		}
		if len(allowed) > 0 {
			w.Header().Set("Allow", strings.Join(allowed, ", "))
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s %s: allowed %s", r.Method, r.URL.Path, strings.Join(allowed, ", ")))
			return
		}
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
	})
	// The dashboard makes this listener something browsers talk to; refuse
	// state-changing requests another site's page makes (CSRF). Clients
	// that send no Origin or Sec-Fetch-Site (the CLI, scripts) are unaffected.
	csrf := http.NewCrossOriginProtection()
	csrf.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusForbidden, "forbidden", "cross-origin request refused: change the broker from its own dashboard, the CLI or a script")
	}))
	return csrf.Handler(mux)
}

// api holds the handler's configuration. Its only state is permsMu, which
// makes each PATCH of a user's permissions (read, change, write) atomic
// against the others.
type api struct {
	cfg     Config
	permsMu sync.Mutex
}

func (a *api) problems() []string {
	if a.cfg.Problems == nil {
		return nil
	}
	return a.cfg.Problems()
}

// needBroker answers 503 when the handler has no broker.
func (a *api) needBroker(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.cfg.Broker == nil {
			writeError(w, http.StatusServiceUnavailable, "unavailable", "this admin listener has no broker")
			return
		}
		h(w, r)
	}
}

// requestContext bounds a request's wait for the broker.
func requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), requestTimeoutMs*time.Millisecond)
}

// ErrorBody is the JSON of every non-2xx JSON answer.
type ErrorBody struct {
	// Code is a stable snake_case name: bad_request, not_found, conflict,
	// internal, not_implemented, unavailable, or the broker's own error
	// name (limit_exceeded, shutting_down, ...).
	Code string `json:"code"`
	// Error is a readable sentence for people.
	Error string `json:"error"`
	// Owner is set with code not_owner: the client address of a node
	// that serves the queue's partition.
	Owner string `json:"owner,omitempty"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, ErrorBody{Code: code, Error: msg})
}

// writeBrokerError answers err, a broker or partition error, with the status
// its protocol code calls for.
func writeBrokerError(w http.ResponseWriter, err error) {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the broker did not answer in time: "+err.Error())
		return
	}
	code := protocol.CodeOf(err)
	writeJSON(w, brokerStatus(code), ErrorBody{Code: code.String(), Error: err.Error(), Owner: ownerOf(err)})
}

// brokerStatus is the HTTP status of a broker error with protocol code
// code. Only internal (a failure inside the broker, or an error without a
// code) is 500: another node's answer (not_owner, fenced) and every other
// retryable code is 503, any other code the broker refuses the request
// with is 400.
func brokerStatus(code protocol.Code) int {
	switch code {
	case protocol.CodeInternal:
		return http.StatusInternalServerError
	case protocol.CodeNotFound:
		return http.StatusNotFound
	case protocol.CodeConflict:
		return http.StatusConflict
	case protocol.CodePermissionDenied:
		return http.StatusForbidden
	}
	if code.Retryable() {
		return http.StatusServiceUnavailable
	}
	return http.StatusBadRequest
}

// ownerOf is the owner address a not_owner error names ("" otherwise).
func ownerOf(err error) string {
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Code == protocol.CodeNotOwner {
		return pe.Owner
	}
	return ""
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(append(data, '\n'))
}

// bodyBytesMax bounds every request body; the largest, a replay of 100
// offsets, takes a few kilobytes.
const bodyBytesMax = 64 << 10

// bodyError says what is wrong with a request body in the API's terms
// (the field, the value given and what it takes) rather than in the
// decoder's (Go types and struct names).
func bodyError(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		what := te.Value
		if te.Field == "" {
			return fmt.Sprintf("the body is a JSON %s; it takes an object", what)
		}
		return fmt.Sprintf("field %q: a %s where it takes %s", te.Field, what, jsonKindOf(te.Type))
	case errors.As(err, &se):
		return fmt.Sprintf("not valid JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "the JSON ends early"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// jsonKindOf describes what JSON value a field of type t takes.
func jsonKindOf(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint:
		return fmt.Sprintf("a whole number from 0 to %d", uint64(1)<<(t.Bits())-1)
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Int:
		return fmt.Sprintf("a whole number from %d to %d", -(int64(1) << (t.Bits() - 1)), int64(1)<<(t.Bits()-1)-1)
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "another kind of value"
}

// decodeBody reads a JSON body into v, refusing unknown fields and
// trailing data. An empty body leaves v as it is when emptyOK.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, emptyOK bool) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, bodyBytesMax))
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "read body: "+err.Error())
		return false
	}
	if len(strings.TrimSpace(string(body))) == 0 && emptyOK {
		return true
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "body: "+bodyError(err))
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "bad_request", "body has data after the JSON value")
		return false
	}
	return true
}

// VersionView is the JSON of GET /api/v1/version.
type VersionView struct {
	Version string `json:"version"`
	API     string `json:"api"`
}

func (a *api) version(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, VersionView{Version: a.cfg.Version, API: APIVersion})
}

// DrainView is the JSON of an accepted POST /api/v1/drain.
type DrainView struct {
	Draining bool `json:"draining"`
}

func (a *api) drain(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Drain == nil {
		writeError(w, http.StatusNotImplemented, "not_implemented", "this build has no planned drain; stop the broker with SIGTERM, which drains before it exits")
		return
	}
	if err := a.cfg.Drain(r.Context()); err != nil {
		writeBrokerError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, DrainView{Draining: true})
}
