package admin

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/sinewmq/sinew/internal/membership"
)

// NodesView is the JSON of GET /api/v1/nodes: this node and the cluster
// nodes it knows of, as its membership sees them.
type NodesView struct {
	// Cluster is false when the node runs alone (cluster.enabled = false);
	// Self is then empty and Nodes lists nothing.
	Cluster bool     `json:"cluster"`
	Self    NodeView `json:"self"`
	// Fenced: this node sees a majority of its peers dead.
	Fenced bool       `json:"fenced"`
	Nodes  []NodeView `json:"nodes"`
	// Controller is this node's replica of the controller group (absent
	// when the node runs alone).
	Controller *ControllerView `json:"controller,omitempty"`
}

// ControllerView is the controller group as this node's replica sees it:
// its leader and term, its voters and learners (node ids), how far the
// replica applied the log, and the committed node table.
type ControllerView struct {
	Leader   string               `json:"leader"`
	Term     uint64               `json:"term"`
	Voters   []string             `json:"voters"`
	Learners []string             `json:"learners"`
	Applied  uint64               `json:"applied"`
	Nodes    []ControllerNodeView `json:"nodes"`
	// Error is set once this replica failed; it then does nothing more
	// until the node restarts.
	Error string `json:"error,omitempty"`
}

// ControllerNodeView is one node of the committed node table.
type ControllerNodeView struct {
	ID         string `json:"id"`
	RaftID     uint64 `json:"raft_id"`
	ClientAddr string `json:"client_addr"`
	PeerAddr   string `json:"peer_addr"`
	Left       bool   `json:"left"`
}

// NodeView is one node: its stable id, its state in this node's view
// (self, alive, dead or left) and its addresses.
type NodeView struct {
	ID         string `json:"id"`
	State      string `json:"state"`
	GossipAddr string `json:"gossip_addr"`
	ClientAddr string `json:"client_addr,omitempty"`
	// Load is the last load report this node received from the peer
	// (absent for self, for a peer not alive, and before a first report).
	Load *NodeLoadView `json:"load,omitempty"`
}

// NodeLoadView is a peer's last load report (docs/cluster.md, "Load
// signals"): advisory numbers placement uses among otherwise equal nodes.
type NodeLoadView struct {
	// PartitionsLed is the partitions the peer leads; Backlog their ready
	// and in-flight messages; AppendRate the records it appended per
	// second over its last interval.
	PartitionsLed uint32 `json:"partitions_led"`
	Backlog       uint64 `json:"backlog"`
	AppendRate    uint32 `json:"append_rate"`
	// AgeMs is how long ago this node received it; Stale is set past
	// three report intervals, when placement ignores it.
	AgeMs int64 `json:"age_ms"`
	Stale bool  `json:"stale"`
}

// ErrNotClustered is what Config.LeaveCluster returns on a node that is
// not in a cluster.
var ErrNotClustered = errors.New("this node is not in a cluster (cluster.enabled = false)")

func (a *api) nodes(w http.ResponseWriter, _ *http.Request) {
	v := NodesView{Nodes: []NodeView{}}
	if a.cfg.Nodes != nil {
		v = a.cfg.Nodes()
		if v.Nodes == nil {
			v.Nodes = []NodeView{}
		}
	}
	writeJSON(w, http.StatusOK, v)
}

// LeaveView is the JSON of an accepted POST /api/v1/nodes/self/leave.
type LeaveView struct {
	Left     bool `json:"left"`
	Draining bool `json:"draining"`
}

func (a *api) leave(w http.ResponseWriter, r *http.Request) {
	if a.cfg.LeaveCluster == nil {
		writeError(w, http.StatusConflict, "conflict", ErrNotClustered.Error())
		return
	}
	if err := a.cfg.LeaveCluster(r.Context()); err != nil {
		if errors.Is(err, ErrNotClustered) {
			writeError(w, http.StatusConflict, "conflict", err.Error())
			return
		}
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	writeJSON(w, http.StatusAccepted, LeaveView{Left: true, Draining: true})
}

// ForgetView is the JSON of an accepted POST /api/v1/nodes/{id}/forget.
type ForgetView struct {
	Forgotten string `json:"forgotten"`
}

func (a *api) forget(w http.ResponseWriter, r *http.Request) {
	if a.cfg.ForgetNode == nil {
		writeError(w, http.StatusConflict, "conflict", ErrNotClustered.Error())
		return
	}
	id := r.PathValue("id")
	if err := a.cfg.ForgetNode(id); err != nil {
		if errors.Is(err, membership.ErrUnknownNode) {
			writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no node %q in this node's view (sinew admin nodes lists them)", id))
			return
		}
		if errors.Is(err, membership.ErrNotDead) {
			writeError(w, http.StatusConflict, "conflict", fmt.Sprintf("node %q is alive in this node's view: only a dead node can be forgotten", id))
			return
		}
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, ForgetView{Forgotten: id})
}
