package admin

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
)

// Operator moves of a queue's replicas between cluster nodes
// (docs/cluster.md, "Moving a queue's replicas"):
//
//	GET  /api/v1/moves              the running moves and the last ended ones, with each partition's step
//	POST /api/v1/moves              start one (202 with the move)
//	GET  /api/v1/moves/{id}         one move
//	POST /api/v1/moves/{id}/cancel  cancel one that has not cut over
//	POST /api/v1/moves/unpin        hand a queue an operator moved back to the rebalancer

// MovesView is the JSON of GET /api/v1/moves.
type MovesView struct {
	// Cluster is false on a node that runs alone; Moves is then empty.
	Cluster bool       `json:"cluster"`
	Moves   []MoveView `json:"moves"`
	// Pinned is the queues an operator moved, which the rebalancer leaves
	// where they are until they are unpinned.
	Pinned []QueueRef `json:"pinned"`
}

// QueueRef names a queue; it is also the body of POST /api/v1/moves/unpin.
type QueueRef struct {
	Topic string `json:"topic"`
	Group string `json:"group"`
}

// MoveView is one operator move.
type MoveView struct {
	ID    uint64 `json:"id"`
	Topic string `json:"topic"`
	Group string `json:"group"`
	// Partition is the partition the operator named (null: the queue).
	// Every partition of the queue moves either way: they share one
	// replica set.
	Partition *int `json:"partition"`
	// From and To are the source and target nodes' ids; FromAddr and
	// ToAddr their client addresses.
	From     string `json:"from"`
	FromAddr string `json:"from_addr,omitempty"`
	To       string `json:"to"`
	ToAddr   string `json:"to_addr,omitempty"`
	// State is pending, catching_up, cutting_over, done, cancelled or
	// failed; Reason says why a move was cancelled or failed.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Cancellable is set while a cancel would still leave the queue on
	// its old replicas (before the cut-over).
	Cancellable bool `json:"cancellable"`
	// StartedAt and EndedAt are controller log indexes (EndedAt 0: running).
	StartedAt uint64 `json:"started_at"`
	EndedAt   uint64 `json:"ended_at,omitempty"`
	// Partitions is each partition's step while the move runs, as this
	// node's replica of the queue sees it (absent when this node holds
	// none: ask a node in the queue's replicas).
	Partitions []MovePartitionView `json:"partitions,omitempty"`
}

// MovePartitionView is one partition's step in a running move.
type MovePartitionView struct {
	Partition int `json:"partition"`
	// Moving is the catalogue's flag: the partition's owner has not yet
	// reported its group voting with the placed replicas.
	Moving bool `json:"moving"`
	// Step is adding, catching_up, caught_up, transferring, removing or
	// in_place.
	Step  string `json:"step"`
	Owner string `json:"owner,omitempty"`
	// Applied is how far the target's log matches the owner's, Commit
	// the owner's commit index and Lag the difference: known only on
	// the node that owns the partition (null elsewhere).
	Applied *uint64 `json:"applied,omitempty"`
	Commit  *uint64 `json:"commit,omitempty"`
	Lag     *uint64 `json:"lag,omitempty"`
}

// MoveRequest is the JSON body of POST /api/v1/moves. Nodes are named by
// their node id (as GET /api/v1/nodes lists them), a prefix of it that
// names one node, or their client address.
type MoveRequest struct {
	Topic string `json:"topic"`
	Group string `json:"group"`
	// Partition is optional: the queue's partitions share one replica
	// set, so a partition may be named only for a queue of one.
	Partition *int `json:"partition"`
	// From is optional: without it the controller picks the replica on
	// the node holding the most replicas.
	From string `json:"from"`
	To   string `json:"to"`
}

// MoveCancel is the optional JSON body of POST /api/v1/moves/{id}/cancel.
type MoveCancel struct {
	Reason string `json:"reason"`
}

// Error is an API error with its HTTP status and code, as a Config
// function returns it.
type Error struct {
	Status int
	Code   string
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// moveReasonBytesMax bounds a cancel's reason.
const moveReasonBytesMax = 256

func (a *api) listMoves(w http.ResponseWriter, r *http.Request) {
	v := MovesView{Moves: []MoveView{}, Pinned: []QueueRef{}}
	if a.cfg.Moves != nil {
		ctx, cancel := requestContext(r)
		defer cancel()
		v = a.cfg.Moves(ctx)
		if v.Moves == nil {
			v.Moves = []MoveView{}
		}
		if v.Pinned == nil {
			v.Pinned = []QueueRef{}
		}
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *api) getMove(w http.ResponseWriter, r *http.Request) {
	id, ok := moveID(w, r)
	if !ok {
		return
	}
	if a.cfg.Moves != nil {
		ctx, cancel := requestContext(r)
		defer cancel()
		for _, m := range a.cfg.Moves(ctx).Moves {
			if m.ID == id {
				writeJSON(w, http.StatusOK, m)
				return
			}
		}
	}
	writeError(w, http.StatusNotFound, "unknown_move", "no move "+strconv.FormatUint(id, 10)+" (GET /api/v1/moves lists them)")
}

func (a *api) startMove(w http.ResponseWriter, r *http.Request) {
	var req MoveRequest
	if !decodeBody(w, r, &req, false) {
		return
	}
	switch {
	case req.Topic == "":
		writeError(w, http.StatusBadRequest, "bad_request", "topic is required")
		return
	case strings.TrimSpace(req.To) == "":
		writeError(w, http.StatusBadRequest, "bad_request", "to (the node that takes the replica) is required")
		return
	case req.Partition != nil && *req.Partition < 0:
		writeError(w, http.StatusBadRequest, "bad_request", "partition must be 0 or more")
		return
	}
	if a.cfg.StartMove == nil {
		writeError(w, http.StatusConflict, "not_clustered", ErrNotClustered.Error())
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	m, err := a.cfg.StartMove(ctx, req)
	if err != nil {
		writeMoveError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, m)
}

func (a *api) cancelMove(w http.ResponseWriter, r *http.Request) {
	id, ok := moveID(w, r)
	if !ok {
		return
	}
	var body MoveCancel
	if !decodeBody(w, r, &body, true) {
		return
	}
	if len(body.Reason) > moveReasonBytesMax {
		writeError(w, http.StatusBadRequest, "bad_request", "reason is longer than 256 bytes")
		return
	}
	if a.cfg.CancelMove == nil {
		writeError(w, http.StatusConflict, "not_clustered", ErrNotClustered.Error())
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	m, err := a.cfg.CancelMove(ctx, id, body.Reason)
	if err != nil {
		writeMoveError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

func (a *api) unpinQueue(w http.ResponseWriter, r *http.Request) {
	var q QueueRef
	if !decodeBody(w, r, &q, false) {
		return
	}
	if q.Topic == "" {
		writeError(w, http.StatusBadRequest, "bad_request", "topic is required")
		return
	}
	if a.cfg.UnpinQueue == nil {
		writeError(w, http.StatusConflict, "not_clustered", ErrNotClustered.Error())
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	if err := a.cfg.UnpinQueue(ctx, q.Topic, q.Group); err != nil {
		writeMoveError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"topic": q.Topic, "group": q.Group, "pinned": false})
}

func moveID(w http.ResponseWriter, r *http.Request) (uint64, bool) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil || id == 0 {
		writeError(w, http.StatusBadRequest, "bad_request", "a move id is a positive integer (GET /api/v1/moves lists them)")
		return 0, false
	}
	return id, true
}

func writeMoveError(w http.ResponseWriter, err error) {
	var ae *Error
	switch {
	case errors.As(err, &ae):
		writeError(w, ae.Status, ae.Code, ae.Msg)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the controller did not apply it in time (is there a controller leader?): "+err.Error())
	default:
		writeBrokerError(w, err) // a coded error keeps its code; others are internal
	}
}
