package controller

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
)

// Node is one node in the controller's committed node table.
type Node struct {
	// RaftID names the node in every raft group (RaftIDOf its ID).
	RaftID uint64 `json:"raft_id"`
	// ID is the node's 128-bit id (internal/nodeid), in hex.
	ID string `json:"id"`
	// ClientAddr and PeerAddr are where clients and peer nodes reach it.
	ClientAddr string `json:"client_addr,omitempty"`
	PeerAddr   string `json:"peer_addr,omitempty"`
	// GossipAddr is where the node's membership gossip was last heard
	// (empty: not known yet). A node that restarts without seeds joins
	// the gossip addresses of the nodes its own table holds.
	GossipAddr string `json:"gossip_addr,omitempty"`
	// JoinedAt is the controller log index of the entry that added it.
	JoinedAt uint64 `json:"joined_at"`
	// Left is set once the node left the cluster on purpose.
	Left bool `json:"left,omitempty"`
	// Boot names the run of the node's process the table last heard of
	// (membership.Meta.Boot; zero when none was sent). A node that left
	// is admitted again only from another run: the process that left
	// stays alive while it hands its replicas over, and is not a node
	// coming back.
	Boot uint64 `json:"boot,omitempty"`
}

// Table is the controller's replicated state: the node table. Every
// replica applies the same committed entries in the same order and so
// holds the same Table at the same index.
type Table struct {
	// Nodes is sorted by RaftID.
	Nodes []Node `json:"nodes"`
	// Queues is the queue catalogue, sorted by topic then group.
	Queues []Queue `json:"queues,omitempty"`
	// NextRaftGroup is the raft group id the next placed partition gets.
	NextRaftGroup uint64 `json:"next_raft_group,omitempty"`
	// Runtime is the cluster's runtime settings (nil until the first
	// node's are committed).
	Runtime *Runtime `json:"runtime,omitempty"`
	// CohortReports is the cohort members each node serves (cohorts.go),
	// sorted by topic, group, cohort then node.
	CohortReports []CohortReport `json:"cohort_reports,omitempty"`
	// CohortPlans is the committed plan of each cohort of a queue
	// (cohorts.go), sorted by topic, group then cohort.
	CohortPlans []CohortPlan `json:"cohort_plans,omitempty"`
	// Moves is the operator moves (moves.go): the running ones and the
	// last ended ones, in the order they started.
	Moves []Move `json:"moves,omitempty"`
	// plansSeq counts the changes of CohortPlans this replica applied
	// (not stored: it only tells publish that they changed).
	plansSeq uint64
}

// Member is a node as the cluster's membership currently sees it, the input
// of Controller.Reconcile.
type Member struct {
	Node
	// Gone: the node left on purpose (not merely unreachable).
	Gone bool
	// Dead: membership declared the node dead (it stopped answering
	// probes); it may come back.
	Dead bool
}

// Command kinds.
const (
	opJoin           = "join"
	opLeave          = "leave"
	opCreateQueue    = "create_queue"
	opReplaceReplica = "replace_replica"
	opAddReplica     = "add_replica"
	opDeleteQueue    = "delete_queue"
	opUpdateQueue    = "update_queue"
	opPlacementDone  = "placement_done"
	opSetRuntime     = "set_runtime"
	opPurgeQueue     = "purge_queue"
	opPurgeDone      = "purge_done"
	opCohortReport   = "cohort_report"
	opCohortPlan     = "cohort_plan"
	opStartMove      = "start_move"
	opCancelMove     = "cancel_move"
	opUnpinQueue     = "unpin_queue"
)

// commandVersion is the encoding version of a controller command; a
// replica refuses a command of a version it does not know rather than
// skip it, since every replica must apply the same entries.
const commandVersion = 1

// recordType is the first byte of a controller entry's data, the record
// type the raft log stores it under (internal/raftlog).
const recordType = 1

// commandBytesMax bounds one encoded command (a queue's placement is the
// largest).
const commandBytesMax = 256 << 10

type command struct {
	V      int    `json:"v"`
	Op     string `json:"op"`
	Node   *Node  `json:"node,omitempty"`
	RaftID uint64 `json:"raft_id,omitempty"`
	// Boot is leave's run of the node that leaves (zero: not known).
	Boot  uint64 `json:"boot,omitempty"`
	Queue *Queue `json:"queue,omitempty"`
	// From and To are replace_replica's nodes; To is add_replica's.
	From uint64 `json:"from,omitempty"`
	To   uint64 `json:"to,omitempty"`
	// Partition, RaftGroup and Replicas are placement_done's partition.
	Partition int      `json:"partition,omitempty"`
	RaftGroup uint64   `json:"raft_group,omitempty"`
	Replicas  []uint64 `json:"replicas,omitempty"`
	// Runtime and Expected are set_runtime's settings and the version
	// they replace.
	Runtime  *Runtime `json:"runtime,omitempty"`
	Expected uint64   `json:"expected,omitempty"`
	// Seq and Count are purge_done's purge and how many it discarded
	// (with Partition).
	Seq   uint64 `json:"seq,omitempty"`
	Count uint64 `json:"count,omitempty"`
	// Cohort names cohort_report's and cohort_plan's cohort (of Queue);
	// Members are cohort_report's member ids (RaftID its node);
	// Generation and Owners are cohort_plan's plan.
	Cohort     string   `json:"cohort,omitempty"`
	Members    []string `json:"members,omitempty"`
	Generation uint64   `json:"generation,omitempty"`
	Owners     []string `json:"owners,omitempty"`
	// Move is start_move's move, or cancel_move's (its ID, the state it
	// ends in and why).
	Move *Move `json:"move,omitempty"`
}

// ErrCommand reports a committed entry the table cannot apply: of an
// unknown version or kind, or malformed.
var ErrCommand = errors.New("controller: bad command")

func encode(c command) ([]byte, error) {
	c.V = commandVersion
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	if len(b)+1 > commandBytesMax {
		return nil, fmt.Errorf("%w: %d bytes", ErrCommand, len(b))
	}
	return append([]byte{recordType}, b...), nil
}

func decode(data []byte) (command, error) {
	var c command
	if len(data) < 2 || data[0] != recordType {
		return c, fmt.Errorf("%w: record type", ErrCommand)
	}
	if err := json.Unmarshal(data[1:], &c); err != nil {
		return c, fmt.Errorf("%w: %w", ErrCommand, err)
	}
	if c.V != commandVersion {
		return c, fmt.Errorf("%w: version %d", ErrCommand, c.V)
	}
	return c, nil
}

// apply applies one committed command at index.
func (t *Table) apply(index uint64, c command) error {
	switch c.Op {
	case opJoin:
		if c.Node == nil || c.Node.RaftID == 0 || c.Node.ID == "" {
			return fmt.Errorf("%w: join without a node", ErrCommand)
		}
		n := *c.Node
		if i, ok := t.find(n.RaftID); ok && t.Nodes[i].ID != n.ID {
			// Two node ids with the same first 64 bits (RaftIDOf): the
			// first keeps the raft id; the other is not admitted.
			// Every replica decides the same, so this is no error.
			return nil
		} else if ok {
			// A node joining again (new addresses, or back after it
			// left) keeps its place in the join order. A join that
			// names no gossip address (from a leader that does not
			// know it) keeps the one recorded.
			t.Nodes[i].ClientAddr, t.Nodes[i].PeerAddr, t.Nodes[i].Left, t.Nodes[i].Boot = n.ClientAddr, n.PeerAddr, false, n.Boot
			if n.GossipAddr != "" {
				t.Nodes[i].GossipAddr = n.GossipAddr
			}
			return nil
		}
		n.JoinedAt, n.Left = index, false
		t.Nodes = append(t.Nodes, n)
		sort.Slice(t.Nodes, func(i, j int) bool { return t.Nodes[i].RaftID < t.Nodes[j].RaftID })
	case opLeave:
		if i, ok := t.find(c.RaftID); ok {
			t.Nodes[i].Left = true
			if c.Boot != 0 {
				t.Nodes[i].Boot = c.Boot
			}
			t.dropReportsOf(c.RaftID)
		}
	case opCreateQueue:
		return t.applyCreateQueue(index, c.Queue)
	case opReplaceReplica:
		return t.applyReplaceReplica(&c)
	case opAddReplica:
		return t.applyAddReplica(&c)
	case opDeleteQueue:
		if err := t.applyDeleteQueue(&c); err != nil {
			return err
		}
		t.advanceMoves(index)
	case opUpdateQueue:
		return t.applyUpdateQueue(&c)
	case opPlacementDone:
		if err := t.applyPlacementDone(&c); err != nil {
			return err
		}
		t.advanceMoves(index)
	case opSetRuntime:
		return t.applySetRuntime(&c)
	case opPurgeQueue:
		return t.applyPurgeQueue(index, &c)
	case opPurgeDone:
		return t.applyPurgeDone(&c)
	case opCohortReport:
		return t.applyCohortReport(&c)
	case opCohortPlan:
		return t.applyCohortPlan(&c)
	case opStartMove:
		return t.applyStartMove(index, &c)
	case opCancelMove:
		return t.applyCancelMove(index, &c)
	case opUnpinQueue:
		return t.applyUnpinQueue(&c)
	default:
		return fmt.Errorf("%w: op %q", ErrCommand, c.Op)
	}
	return nil
}

func (t *Table) find(raftID uint64) (int, bool) {
	i := sort.Search(len(t.Nodes), func(i int) bool { return t.Nodes[i].RaftID >= raftID })
	return i, i < len(t.Nodes) && t.Nodes[i].RaftID == raftID
}

// Node returns the node with raftID.
func (t *Table) Node(raftID uint64) (Node, bool) {
	i, ok := t.find(raftID)
	if !ok {
		return Node{}, false
	}
	return t.Nodes[i], true
}

// clone copies the table's lists; their Queue entries are shared, as
// applied entries are never changed in place.
func (t *Table) clone() *Table {
	return &Table{Nodes: slices.Clone(t.Nodes), Queues: slices.Clone(t.Queues), NextRaftGroup: t.NextRaftGroup, Runtime: t.Runtime,
		CohortReports: slices.Clone(t.CohortReports), CohortPlans: slices.Clone(t.CohortPlans), Moves: slices.Clone(t.Moves), plansSeq: t.plansSeq}
}

// members returns the raft ids of the nodes that have not left, in join
// order.
func (t *Table) members() []uint64 {
	ms := make([]Node, 0, len(t.Nodes))
	for _, n := range t.Nodes {
		if !n.Left {
			ms = append(ms, n)
		}
	}
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].JoinedAt != ms[j].JoinedAt {
			return ms[i].JoinedAt < ms[j].JoinedAt
		}
		return ms[i].RaftID < ms[j].RaftID
	})
	ids := make([]uint64, len(ms))
	for i, n := range ms {
		ids[i] = n.RaftID
	}
	return ids
}
