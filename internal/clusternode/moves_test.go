package clusternode

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/controller"
)

// TestResolveMoveNode: a move names a node by id (any case), a prefix of
// four or more digits naming one node, or its client address; anything
// else is a typed error.
func TestResolveMoveNode(t *testing.T) {
	tbl := &controller.Table{Nodes: []controller.Node{
		{RaftID: 1, ID: "abcd0001000000000000000000000000", ClientAddr: "10.0.0.1:7654"},
		{RaftID: 2, ID: "abcd0002000000000000000000000000", ClientAddr: "10.0.0.2:7654"},
		{RaftID: 3, ID: "ef010000000000000000000000000000", ClientAddr: "10.0.0.3:7654"},
	}}
	for _, tc := range []struct {
		in   string
		want uint64
		code string
	}{
		{"ABCD0002000000000000000000000000", 2, ""},
		{"10.0.0.3:7654", 3, ""},
		{" abcd0001 ", 1, ""},
		{"ef01", 3, ""},
		{"abcd", 0, "ambiguous_node"},
		{"ef0", 0, "unknown_node"},
		{"9999", 0, "unknown_node"},
		{"", 0, "unknown_node"},
	} {
		got, err := resolveMoveNode(tbl, "to", tc.in)
		var ae *admin.Error
		switch {
		case tc.code == "" && (err != nil || got != tc.want):
			t.Errorf("%q: %d, %v; want %d", tc.in, got, err, tc.want)
		case tc.code != "" && (!errors.As(err, &ae) || ae.Code != tc.code):
			t.Errorf("%q: %d, %v; want %s", tc.in, got, err, tc.code)
		}
	}
}

// TestMoveAPIError: each controller refusal has its HTTP status.
func TestMoveAPIError(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("%w: x", controller.ErrNoQueue), 404, "not_found"},
		{controller.ErrNoLeader, 503, "unavailable"},
		{controller.ErrMoveNoPartition, 404, "unknown_partition"},
		{controller.ErrMoveUnknown, 404, "unknown_move"},
		{controller.ErrMovePerQueue, 400, "partition_move_per_queue"},
		{controller.ErrMoveRunning, 409, "move_running"},
		{controller.ErrMoveCutOver, 409, "cut_over_started"},
		{controller.ErrMoveBusy, 409, "replicas_changing"},
	} {
		var ae *admin.Error
		if !errors.As(moveAPIError(tc.err), &ae) || ae.Status != tc.status || ae.Code != tc.code || ae.Msg == "" {
			t.Errorf("%v: %+v, want %d %s", tc.err, ae, tc.status, tc.code)
		}
	}
}
