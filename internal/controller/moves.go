package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
)

// Operator moves: an operator asks for a queue's replica on one node to
// move to another (StartMove). The move lives in the table, so whichever
// node leads the controller, before or after a crash, carries it on:
//
//  1. start_move appends the target to every partition's replicas and
//     marks them moving (state catching_up). Each partition's owner adds
//     the target as a learner, catches it up and promotes it to voter, and
//     reports the group voting with those replicas (placement_done).
//  2. The placement_done that clears the last moving partition of the
//     queue cuts over, in the same entry: the target takes the source's
//     place in every partition (its preferred-owner rank too) and the
//     partitions move again (state cutting_over). An owner that is the
//     source hands its lead to a caught-up wanted voter first; the new
//     owner removes the source.
//  3. The placement_done that clears the last moving partition after the
//     cut-over ends the move (state done) and pins the queue: the
//     rebalancer leaves its replicas where the operator put them (the
//     recovery plan still replaces a replica whose node dies or leaves),
//     until an operator unpins it (unpin_queue).
//
// A move may be cancelled while it catches up (cancel_move): the target is
// taken out of every partition's replicas again, and the owners remove it.
// From the cut-over on the move can only finish. A target that dies (past
// the dead node's grace) or leaves while the move catches up fails the
// move the same way (state failed).
//
// Replicas are placed per queue (every partition of a queue has the same
// replica set), so a move moves every partition of its queue; a move may
// name a partition only of a queue that has one.

// Move states.
const (
	// MoveCatchingUp: the target is being added to every partition's
	// group (a learner, caught up, then promoted to voter).
	MoveCatchingUp = "catching_up"
	// MoveCuttingOver: the target holds the source's place; owners hand
	// their lead over where the source leads, and remove the source.
	MoveCuttingOver = "cutting_over"
	// MoveDone: every partition's group votes with the new replicas.
	MoveDone = "done"
	// MoveCancelled: an operator cancelled it before the cut-over; the
	// queue keeps its replicas (the target is removed again).
	MoveCancelled = "cancelled"
	// MoveFailed: the target died or left before the cut-over; the queue
	// keeps its replicas.
	MoveFailed = "failed"
)

// Move is one operator move in the table.
type Move struct {
	// ID is the controller log index of the entry that started it.
	ID    uint64 `json:"id"`
	Topic string `json:"topic"`
	Group string `json:"group,omitempty"`
	// Partition is the partition the operator named; -1 when none (the
	// whole queue). Either way every partition of the queue moves.
	Partition int `json:"partition"`
	// From and To are the raft ids of the source and the target.
	From uint64 `json:"from"`
	To   uint64 `json:"to"`
	// State is one of the Move* states.
	State string `json:"state"`
	// EndedAt is the log index of the entry that ended it (0: running).
	EndedAt uint64 `json:"ended_at,omitempty"`
	// Reason says why a move was cancelled or failed.
	Reason string `json:"reason,omitempty"`
	// Token names the request that started it, so that its proposer
	// finds it.
	Token string `json:"token,omitempty"`
}

// Running reports whether the move has not ended.
func (m *Move) Running() bool { return m.State == MoveCatchingUp || m.State == MoveCuttingOver }

// Bounds of the moves the table keeps.
const (
	// MovesRunningMax bounds the moves running at once.
	MovesRunningMax = 64
	// movesEndedKept is how many ended moves the table keeps for the
	// operator to see (the oldest go first).
	movesEndedKept = 32
	// moveReasonMax bounds a cancel's reason.
	moveReasonMax = 256
)

// MoveError is a move the controller refuses; Code names why (the admin
// API answers it as the error code).
type MoveError struct {
	Code string
	Msg  string
}

func (e *MoveError) Error() string { return "controller: " + e.Msg }

// Is matches two MoveErrors of the same code, so that errors.Is holds for
// a refusal with details and the bare error of its code.
func (e *MoveError) Is(target error) bool {
	t, ok := target.(*MoveError)
	return ok && t.Code == e.Code
}

// The refusals of StartMove and CancelMove. Each is wrapped in a
// *MoveError of the same code with the details of the refusal.
var (
	ErrMoveNoPartition    = &MoveError{"unknown_partition", "no such partition"}
	ErrMoveNoNode         = &MoveError{"unknown_node", "no such node in the cluster"}
	ErrMoveNotReplica     = &MoveError{"not_a_replica", "the source node holds no replica of the queue"}
	ErrMoveAlreadyReplica = &MoveError{"already_a_replica", "the target node holds a replica of the queue already"}
	ErrMoveNodeNotLive    = &MoveError{"node_not_live", "the target node is not live"}
	ErrMoveRunning        = &MoveError{"move_running", "a move of the queue is running"}
	ErrMoveBusy           = &MoveError{"replicas_changing", "the queue's replicas are changing (the recovery plan or the rebalancer moves them)"}
	ErrMovePerQueue       = &MoveError{"partition_move_per_queue", "the queue's partitions share one replica set, so they move together"}
	ErrMoveTooMany        = &MoveError{"too_many_moves", "too many moves are running"}
	ErrMoveTooManyReps    = &MoveError{"too_many_replicas", "the queue has the most replicas a partition may have"}
	ErrMoveUnknown        = &MoveError{"unknown_move", "no such move"}
	ErrMoveEnded          = &MoveError{"move_ended", "the move has ended"}
	ErrMoveCutOver        = &MoveError{"cut_over_started", "the move has cut over: it can only finish now"}
)

func moveErr(base *MoveError, format string, args ...any) error {
	return &MoveError{Code: base.Code, Msg: base.Msg + ": " + fmt.Sprintf(format, args...)}
}

// MoveRequest is what an operator asks StartMove for.
type MoveRequest struct {
	Topic, Group string
	// Partition is the partition named, or -1 for the whole queue.
	Partition int
	// From is the replica to give up (0: the controller picks the one on
	// the node holding the most replicas).
	From uint64
	// To is the node that takes it.
	To uint64
	// Live reports whether membership holds a node live now; nil uses
	// the view the controller was last handed (Reconcile).
	Live func(raftID uint64) bool
}

// MoveOf returns the move with id.
func (t *Table) MoveOf(id uint64) (Move, bool) {
	for _, m := range t.Moves {
		if m.ID == id {
			return m, true
		}
	}
	return Move{}, false
}

// runningMove returns the index in t.Moves of the running move of queue
// topic/group (-1: none).
func (t *Table) runningMove(topic, group string) int {
	for i := range t.Moves {
		if m := &t.Moves[i]; m.Running() && m.Topic == topic && m.Group == group {
			return i
		}
	}
	return -1
}

// checkMove refuses a move the table would not apply (live is nil in the
// apply, which does not judge liveness). It returns the move's source:
// r.From, or the one it picks.
func (t *Table) checkMove(r MoveRequest, live func(uint64) bool) (uint64, error) {
	q, ok := t.Queue(r.Topic, r.Group)
	if !ok {
		return 0, fmt.Errorf("%w: topic %q group %q", ErrNoQueue, r.Topic, r.Group)
	}
	switch {
	case r.Partition < -1 || r.Partition >= len(q.Partitions):
		return 0, moveErr(ErrMoveNoPartition, "topic %q group %q has partitions 0 to %d, not %d", r.Topic, r.Group, len(q.Partitions)-1, r.Partition)
	case r.Partition >= 0 && len(q.Partitions) > 1:
		return 0, moveErr(ErrMovePerQueue, "topic %q group %q has %d partitions; move the queue (name no partition) to move them all", r.Topic, r.Group, len(q.Partitions))
	}
	if n, ok := t.Node(r.To); !ok || n.Left {
		return 0, moveErr(ErrMoveNoNode, "target %d", r.To)
	}
	if r.From != 0 {
		if n, ok := t.Node(r.From); !ok {
			return 0, moveErr(ErrMoveNoNode, "source %d", r.From)
		} else if n.RaftID == r.To {
			return 0, moveErr(ErrMoveAlreadyReplica, "the source and the target are the same node")
		}
	}
	if t.runningMove(r.Topic, r.Group) >= 0 {
		return 0, moveErr(ErrMoveRunning, "topic %q group %q (list them: GET /api/v1/moves)", r.Topic, r.Group)
	}
	set := replicaSet(&q)
	if slices.Contains(set, r.To) {
		return 0, moveErr(ErrMoveAlreadyReplica, "node %d holds topic %q group %q", r.To, r.Topic, r.Group)
	}
	if movingAny(&q) {
		return 0, moveErr(ErrMoveBusy, "topic %q group %q; try again once it settles", r.Topic, r.Group)
	}
	from := r.From
	if from == 0 {
		// The replica on the node holding the most replicas, among
		// equals the last in the placement (not the preferred owner).
		load := t.replicaCounts()
		rs := q.Partitions[0].Replicas
		for i := len(rs) - 1; i >= 0; i-- {
			if from == 0 || load[rs[i]] > load[from] {
				from = rs[i]
			}
		}
	}
	for _, p := range q.Partitions {
		if !slices.Contains(p.Replicas, from) {
			return 0, moveErr(ErrMoveNotReplica, "node %d, topic %q group %q", from, r.Topic, r.Group)
		}
		if len(p.Replicas) >= ReplicationMax {
			return 0, moveErr(ErrMoveTooManyReps, "%d", ReplicationMax)
		}
	}
	running := 0
	for i := range t.Moves {
		if t.Moves[i].Running() {
			running++
		}
	}
	if running >= MovesRunningMax {
		return 0, moveErr(ErrMoveTooMany, "%d at most", MovesRunningMax)
	}
	if live != nil && !live(r.To) {
		return 0, moveErr(ErrMoveNodeNotLive, "node %d", r.To)
	}
	return from, nil
}

// applyStartMove starts an operator move: the target joins every
// partition's replicas, after the others. A move the table refuses
// (checkMove) is applied as nothing, the same way on every replica.
func (t *Table) applyStartMove(index uint64, c *command) error {
	if c.Move == nil || c.Move.Topic == "" || c.Move.From == 0 || c.Move.To == 0 {
		return errCommandf("start_move without a queue or nodes")
	}
	m := *c.Move
	from, err := t.checkMove(MoveRequest{Topic: m.Topic, Group: m.Group, Partition: m.Partition, From: m.From, To: m.To}, nil)
	if err != nil || from != m.From {
		return nil
	}
	t.rewriteReplicas(m.Topic, m.Group, func(pl Placement) ([]uint64, bool) {
		return append(slices.Clone(pl.Replicas), m.To), true
	})
	m.ID, m.State, m.EndedAt, m.Reason = index, MoveCatchingUp, 0, ""
	t.Moves = append(slices.Clone(t.Moves), m)
	return nil
}

// applyCancelMove takes a move's target out of every partition's replicas
// again while the move catches up, and ends it cancelled (or failed, as
// c.Move.State says). It is applied as nothing otherwise.
func (t *Table) applyCancelMove(index uint64, c *command) error {
	if c.Move == nil || c.Move.ID == 0 {
		return errCommandf("cancel_move without a move")
	}
	state := MoveCancelled
	if c.Move.State == MoveFailed {
		state = MoveFailed
	}
	mi := slices.IndexFunc(t.Moves, func(m Move) bool { return m.ID == c.Move.ID })
	if mi < 0 || t.Moves[mi].State != MoveCatchingUp {
		return nil
	}
	m := t.Moves[mi]
	t.rewriteReplicas(m.Topic, m.Group, func(pl Placement) ([]uint64, bool) {
		rs := slices.DeleteFunc(slices.Clone(pl.Replicas), func(r uint64) bool { return r == m.To })
		return rs, len(rs) > 0
	})
	reason := c.Move.Reason
	if len(reason) > moveReasonMax {
		reason = reason[:moveReasonMax]
	}
	t.endMove(mi, index, state, reason)
	return nil
}

// rewriteReplicas gives every partition of queue topic/group the replicas
// change returns for it and marks them moving, and reports whether it did:
// not when the catalogue does not hold the queue or change refuses a
// partition (false).
func (t *Table) rewriteReplicas(topic, group string, change func(Placement) ([]uint64, bool)) bool {
	i, ok := t.findQueue(topic, group)
	if !ok {
		return false
	}
	q := t.Queues[i]
	parts := make([]Placement, len(q.Partitions))
	for p, pl := range q.Partitions {
		rs, ok := change(pl)
		if !ok {
			return false
		}
		parts[p] = Placement{RaftGroup: pl.RaftGroup, Replicas: rs, Bootstrap: pl.Bootstrap, Moving: true}
	}
	q.Partitions = parts
	t.Queues = slices.Clone(t.Queues) // a Status may share the old slice
	t.Queues[i] = q
	return true
}

// endMove ends move mi at index and drops the oldest ended moves beyond
// movesEndedKept.
func (t *Table) endMove(mi int, index uint64, state, reason string) {
	t.Moves = slices.Clone(t.Moves)
	m := &t.Moves[mi]
	m.State, m.EndedAt, m.Reason = state, index, reason
	ended := 0
	for i := len(t.Moves) - 1; i >= 0; i-- {
		if t.Moves[i].Running() {
			continue
		}
		if ended++; ended > movesEndedKept {
			t.Moves = slices.Delete(t.Moves, i, i+1)
		}
	}
}

// advanceMoves carries the running moves on once a placement_done entry
// (at index) applied: a move whose queue no longer moves cuts over, or,
// cut over, ends done and pins its queue. A move whose queue was deleted
// ends failed.
func (t *Table) advanceMoves(index uint64) {
	var running []uint64
	for _, m := range t.Moves {
		if m.Running() {
			running = append(running, m.ID)
		}
	}
	// By id: ending a move may drop older ended ones, which shifts the
	// list.
	for _, id := range running {
		mi := slices.IndexFunc(t.Moves, func(m Move) bool { return m.ID == id })
		m := t.Moves[mi]
		qi, ok := t.findQueue(m.Topic, m.Group)
		if !ok {
			t.endMove(mi, index, MoveFailed, "the queue was deleted")
			continue
		}
		q := &t.Queues[qi]
		if movingAny(q) {
			continue
		}
		if m.State == MoveCuttingOver {
			t.endMove(mi, index, MoveDone, "")
			nq := *q
			nq.Pinned = true
			t.Queues = slices.Clone(t.Queues)
			t.Queues[qi] = nq
			continue
		}
		cut := t.rewriteReplicas(m.Topic, m.Group, func(pl Placement) ([]uint64, bool) {
			if !slices.Contains(pl.Replicas, m.From) || !slices.Contains(pl.Replicas, m.To) {
				return nil, false
			}
			rs := slices.DeleteFunc(slices.Clone(pl.Replicas), func(r uint64) bool { return r == m.To })
			rs[slices.Index(rs, m.From)] = m.To
			return rs, true
		})
		t.Moves = slices.Clone(t.Moves)
		if cut {
			t.Moves[mi].State = MoveCuttingOver
		} else {
			// The source or the target is no longer placed (the recovery
			// plan replaced one): nothing is left to cut over.
			t.endMove(mi, index, MoveFailed, "the queue's replicas changed under the move")
		}
	}
}

// applyUnpinQueue clears a queue's Pinned flag: the rebalancer may move its
// replicas again. A queue the catalogue does not hold is applied as
// nothing.
func (t *Table) applyUnpinQueue(c *command) error {
	if c.Queue == nil || c.Queue.Topic == "" {
		return errCommandf("unpin_queue without a queue")
	}
	i, ok := t.findQueue(c.Queue.Topic, c.Queue.Group)
	if !ok || !t.Queues[i].Pinned {
		return nil
	}
	q := t.Queues[i]
	q.Pinned = false
	t.Queues = slices.Clone(t.Queues) // a Status may share the old slice
	t.Queues[i] = q
	return nil
}

// UnpinQueue hands a pinned queue back to the rebalancer and returns once
// this node applied that, or ctx ends. A queue the catalogue does not hold
// is ErrNoQueue; one that is not pinned is left as it is.
func (c *Controller) UnpinQueue(ctx context.Context, topic, group string) error {
	q, ok := c.Status().Table.Queue(topic, group)
	if !ok {
		return fmt.Errorf("%w: topic %q group %q", ErrNoQueue, topic, group)
	}
	if !q.Pinned {
		return nil
	}
	data, err := encode(command{Op: opUnpinQueue, Queue: &Queue{Topic: topic, Group: group}})
	if err != nil {
		return err
	}
	return c.proposeUntil(ctx, data, func(st Status) bool {
		cur, ok := st.Table.Queue(topic, group)
		return !ok || !cur.Pinned
	})
}

// StartMove starts an operator move (see the top of this file) and returns
// it once this node applied it, or ctx ends. It refuses a move the table
// would not apply with a *MoveError (ErrNoQueue for an unknown queue), and
// one whose target membership does not hold live (ErrMoveNodeNotLive).
func (c *Controller) StartMove(ctx context.Context, r MoveRequest) (Move, error) {
	live := r.Live
	if live == nil {
		live = c.liveMember
	}
	from, err := c.Status().Table.checkMove(r, live)
	if err != nil {
		return Move{}, err
	}
	var tb [8]byte
	_, _ = rand.Read(tb[:])
	token := hex.EncodeToString(tb[:])
	m := Move{Topic: r.Topic, Group: r.Group, Partition: r.Partition, From: from, To: r.To, Token: token}
	data, err := encode(command{Op: opStartMove, Move: &m})
	if err != nil {
		return Move{}, err
	}
	var got Move
	var refused error
	err = c.proposeUntil(ctx, data, func(st Status) bool {
		for _, cur := range st.Table.Moves {
			if cur.Token == token {
				got = cur
				return true
			}
		}
		// Refused meanwhile (another move came first): say why.
		if _, err := st.Table.checkMove(MoveRequest{Topic: r.Topic, Group: r.Group, Partition: r.Partition, From: from, To: r.To}, nil); err != nil {
			refused = err
			return true
		}
		return false
	})
	if err == nil {
		err = refused
	}
	return got, err
}

// CancelMove cancels a move that catches up (see the top of this file) and
// returns it once this node applied the cancel, or ctx ends. A move that
// has cut over is ErrMoveCutOver; one that ended, ErrMoveEnded; an unknown
// one, ErrMoveUnknown.
func (c *Controller) CancelMove(ctx context.Context, id uint64, reason string) (Move, error) {
	check := func(t *Table) (Move, error) {
		m, ok := t.MoveOf(id)
		switch {
		case !ok:
			return m, moveErr(ErrMoveUnknown, "%d", id)
		case m.State == MoveCuttingOver:
			return m, moveErr(ErrMoveCutOver, "move %d", id)
		case !m.Running():
			return m, moveErr(ErrMoveEnded, "move %d is %s", id, m.State)
		}
		return m, nil
	}
	if _, err := check(c.Status().Table); err != nil {
		return Move{}, err
	}
	data, err := encode(command{Op: opCancelMove, Move: &Move{ID: id, State: MoveCancelled, Reason: reason}})
	if err != nil {
		return Move{}, err
	}
	var got Move
	err = c.proposeUntil(ctx, data, func(st Status) bool {
		m, ok := st.Table.MoveOf(id)
		got = m
		return !ok || m.State != MoveCatchingUp
	})
	if err != nil {
		return got, err
	}
	switch got.State {
	case MoveCancelled, MoveFailed:
		return got, nil
	case MoveCuttingOver, MoveDone:
		return got, moveErr(ErrMoveCutOver, "move %d cut over before the cancel applied", id)
	}
	return got, moveErr(ErrMoveUnknown, "%d", id)
}

// liveMember reports whether this node's membership view holds node id
// live.
func (c *Controller) liveMember(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.view {
		if m.RaftID == id {
			return !m.Dead && !m.Gone
		}
	}
	return false
}

// planMoves, on the leader, fails a move that catches up whose target left
// or has been dead past replaceAfterTicks (its queue keeps its replicas),
// and reports whether queue q has a move running (the recovery plan and
// the rebalancer then leave it to the move).
func (c *Controller) planMoves(q *Queue) (bool, error) {
	mi := c.table.runningMove(q.Topic, q.Group)
	if mi < 0 {
		return false, nil
	}
	m := c.table.Moves[mi]
	if m.State != MoveCatchingUp {
		return true, nil
	}
	n, known := c.table.Node(m.To)
	since, dead := c.deadSince[m.To]
	why := ""
	switch {
	case !known || n.Left:
		why = fmt.Sprintf("the target node %d left the cluster", m.To)
	case dead && c.tickN >= since+replaceAfterTicks:
		why = fmt.Sprintf("the target node %d is dead", m.To)
	default:
		return true, nil
	}
	ok, err := c.proposeOnce(fmt.Sprintf("failmove/%d", m.ID), command{Op: opCancelMove, Move: &Move{ID: m.ID, State: MoveFailed, Reason: why}})
	if ok {
		c.log.Warn("controller: an operator move fails: its queue keeps its replicas", "topic", m.Topic, "group", m.Group,
			"move", m.ID, "why", why)
	}
	return true, err
}
