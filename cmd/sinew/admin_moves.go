package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sinewmq/sinew/internal/admin"
)

// `sinew admin partition ...`: operator moves of a queue's replicas
// (docs/cluster.md, "Moving a queue's replicas").

func init() {
	adminCommands["partition"] = adminCommand{summary: "move a queue's replicas between cluster nodes: move | moves | cancel | unpin", verbs: map[string]adminCommand{
		"move":   {summary: "move a queue's replica to another node: move --topic T [--partition N] [--from NODE] --to NODE [--wait]", run: adminPartitionMove},
		"moves":  {summary: "the running moves and the last ended ones, with each partition's step", run: adminPartitionMoves},
		"cancel": {summary: "cancel a move that has not cut over: cancel ID", run: adminPartitionCancel},
		"unpin":  {summary: "hand a queue an operator moved back to the rebalancer: unpin --topic T", run: adminPartitionUnpin},
	}}
}

// moveWaitPoll is how often --wait looks at a move.
const moveWaitPoll = 500 * time.Millisecond

func adminPartitionMove(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	q := addQueueFlags(fs)
	part := fs.Int("partition", -1, "the partition to move; the queue's partitions share one replica set, so only a queue of one partition takes it (default: the whole queue)")
	from := fs.String("from", "", "the node whose replica moves: node id, a unique prefix of it, or client address (default: the controller picks the most loaded)")
	to := fs.String("to", "", "the node that takes the replica: node id, a unique prefix of it, or client address (required)")
	cancelID := fs.Uint64("cancel", 0, "cancel move `ID` instead (as sinew admin partition cancel ID)")
	wait := fs.Bool("wait", false, "wait until the move ends, printing its steps")
	waitFor := fs.Duration("wait-timeout", 10*time.Minute, "give up --wait after this long (the move goes on)")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if *cancelID != 0 {
		c, err := f.client()
		if err != nil {
			return err
		}
		return cancelMove(ctx, c, f, *cancelID, stdout)
	}
	if err := q.check(); err != nil {
		return err
	}
	if strings.TrimSpace(*to) == "" {
		return fmt.Errorf("%w: --to is required (sinew admin nodes lists the nodes)", errUsage)
	}
	if *part < -1 {
		return fmt.Errorf("%w: --partition must be 0 or more", errUsage)
	}
	c, err := f.client()
	if err != nil {
		return err
	}
	req := admin.MoveRequest{Topic: *q.topic, Group: *q.group, From: *from, To: *to}
	if *part >= 0 {
		req.Partition = part
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/api/v1/moves", nil, req, &raw); err != nil {
		return err
	}
	var m admin.MoveView
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("admin API at %s: the answer to POST /api/v1/moves is not the JSON expected: %v", c.addr, err)
	}
	if *f.json && !*wait {
		return printRaw(stdout, raw)
	}
	if !*f.json {
		fmt.Fprintf(stdout, "move %d started: %s from %s to %s (sinew admin partition moves shows its steps; cancel %d stops it before the cut-over)\n",
			m.ID, q, nodeLabel(m.From, m.FromAddr), nodeLabel(m.To, m.ToAddr), m.ID)
	}
	if !*wait {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, *waitFor)
	defer cancel()
	last := ""
	for {
		var cur admin.MoveView
		if _, err := c.do(wctx, http.MethodGet, "/api/v1/moves/"+strconv.FormatUint(m.ID, 10), nil, nil, &cur); err != nil {
			if wctx.Err() != nil {
				return fmt.Errorf("move %d has not ended within --wait-timeout %v; it goes on (sinew admin partition moves)", m.ID, *waitFor)
			}
			return err
		}
		if line := cur.State + " " + moveSteps(cur); line != last && !*f.json {
			fmt.Fprintf(stdout, "move %d: %s\n", m.ID, line)
			last = line
		}
		if cur.EndedAt != 0 {
			if *f.json {
				out, _ := json.MarshalIndent(cur, "", "  ")
				fmt.Fprintf(stdout, "%s\n", out)
			}
			if cur.State != "done" {
				return fmt.Errorf("move %d ended %s: %s", m.ID, cur.State, cur.Reason)
			}
			return nil
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("move %d has not ended within --wait-timeout %v; it goes on (sinew admin partition moves)", m.ID, *waitFor)
		case <-time.After(moveWaitPoll):
		}
	}
}

func adminPartitionMoves(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	var v admin.MovesView
	if render, err := adminGet(ctx, c, f, "/api/v1/moves", nil, stdout, &v); !render {
		return err
	}
	if !v.Cluster {
		_, err := fmt.Fprintf(stdout, "the broker at %s runs alone (cluster.enabled = false): it has no moves\n", c.addr)
		return err
	}
	if len(v.Moves) == 0 {
		fmt.Fprintln(stdout, "no moves")
	} else {
		t := newTable(stdout, "ID", "QUEUE", "FROM", "TO", "STATE", "STEPS")
		for _, m := range v.Moves {
			state := m.State
			if m.Reason != "" {
				state += " (" + m.Reason + ")"
			}
			t.row(m.ID, queueName(m.Topic, m.Group), nodeLabel(m.From, m.FromAddr), nodeLabel(m.To, m.ToAddr), state, moveSteps(m))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if len(v.Pinned) > 0 {
		names := make([]string, 0, len(v.Pinned))
		for _, q := range v.Pinned {
			names = append(names, queueName(q.Topic, q.Group))
		}
		_, err := fmt.Fprintf(stdout, "pinned (the rebalancer leaves them; sinew admin partition unpin hands one back): %s\n", strings.Join(names, ", "))
		return err
	}
	return nil
}

func adminPartitionUnpin(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	q := addQueueFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	if err := q.check(); err != nil {
		return err
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/api/v1/moves/unpin", nil, admin.QueueRef{Topic: *q.topic, Group: *q.group}, &raw); err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	_, err = fmt.Fprintf(stdout, "%s is not pinned: the rebalancer may move its replicas again\n", q)
	return err
}

func adminPartitionCancel(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	var id uint64
	if len(pos) == 1 {
		id, err = strconv.ParseUint(pos[0], 10, 64)
	}
	if len(pos) != 1 || err != nil || id == 0 {
		return fmt.Errorf("%w: name one move by its id (sinew admin partition moves lists them)", errUsage)
	}
	c, err := f.client()
	if err != nil {
		return err
	}
	return cancelMove(ctx, c, f, id, stdout)
}

func cancelMove(ctx context.Context, c *adminClient, f adminFlags, id uint64, stdout io.Writer) error {
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/api/v1/moves/"+strconv.FormatUint(id, 10)+"/cancel", nil, nil, &raw); err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	_, err := fmt.Fprintf(stdout, "move %d cancelled: the queue keeps its replicas (the target's replica is removed again)\n", id)
	return err
}

// nodeLabel names a node by its client address, else its id.
func nodeLabel(id, addr string) string {
	if addr != "" {
		return addr
	}
	return id
}

// moveSteps renders each partition's step of a running move, with the
// target's lag where the node asked knows it.
func moveSteps(m admin.MoveView) string {
	if m.EndedAt != 0 {
		return "-"
	}
	if len(m.Partitions) == 0 {
		return "(ask a node holding the queue)"
	}
	parts := make([]string, 0, len(m.Partitions))
	for _, p := range m.Partitions {
		s := fmt.Sprintf("%d:%s", p.Partition, p.Step)
		if p.Lag != nil {
			s += fmt.Sprintf(" lag %d", *p.Lag)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}
