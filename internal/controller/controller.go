package controller

import (
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/raftlog"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

// Group is the multi-raft group id of the controller.
const Group = 1

// Defaults and bounds.
const (
	// VotersMaxDefault is how many nodes vote in the controller group.
	VotersMaxDefault = 3
	// ReplicationFactorDefault is how many replicas a queue's partitions
	// get where there are that many nodes.
	ReplicationFactorDefault = 3
	// inboundMax bounds the raft messages waiting for the controller's
	// goroutine; beyond it they are dropped (raft resends).
	inboundMax = 1024
	// ticksPerTurnMax bounds the ticks one turn catches up on.
	ticksPerTurnMax = 16
	// segmentBytes is the controller log's segment size: its entries are
	// few and small.
	segmentBytes  = 1 << 20
	electionTicks = 10
	// heartbeatTicks: the leader's heartbeat every 100 ms, five to an election
	// timeout; the controller group ticks on every node all the time.
	heartbeatTicks = 2
	// proposeRetryTicks is how long a proposed join or leave is not
	// proposed again while the table does not show it.
	proposeRetryTicks = 50
	// proposalsMax bounds the proposals waiting for the controller's
	// goroutine (CreateQueue proposes again when one is dropped).
	proposalsMax = 64
	// proposeRetryInterval is how long CreateQueue waits for its entry
	// before it proposes it again (the first may have been lost with a
	// change of leader).
	proposeRetryInterval = time.Second
)

// RaftIDOf maps a node id (internal/nodeid: 32 hex digits) to the raft id
// that names the node in every raft group: its first 64 bits, never 0.
func RaftIDOf(nodeID string) (uint64, error) {
	b, err := hex.DecodeString(nodeID)
	if err != nil || len(b) < 8 {
		return 0, fmt.Errorf("controller: node id %q is not hex of at least 64 bits", nodeID)
	}
	id := binary.BigEndian.Uint64(b[:8])
	if id == 0 {
		id = 1
	}
	return id, nil
}

// Config configures a Controller.
type Config struct {
	// FS and Dir hold the controller's raft log.
	FS  vfs.FS
	Dir string
	// Self is this node (RaftID and ID at least).
	Self Node
	// Bootstrap starts a new controller group with this node as its only
	// voter when Dir holds no controller log yet. A node without it waits
	// for the group's leader to add it.
	Bootstrap bool
	// ReplicationFactor is how many replicas each queue's partitions
	// should have where there are that many nodes; 0 means
	// ReplicationFactorDefault. The recovery plan grows a queue placed
	// with fewer (while the cluster formed) once nodes are there.
	ReplicationFactor int
	// VotersMax is how many nodes vote; 0 means VotersMaxDefault.
	VotersMax int
	// SnapshotEvery is how many applied entries pass between two
	// snapshots, after which the log drops the segments a snapshot
	// covers; 0 means SnapshotEveryDefault.
	SnapshotEvery int
	// SegmentBytes is the log's segment size; 0 means 1 MiB.
	SegmentBytes int64
	// Send hands raft messages to other nodes; it must not block.
	Send func([]*raftpb.Message)
	// Logger receives changes of leader and configuration.
	Logger *slog.Logger
}

// ReplicationFactor is the replication factor the controller plans for
// (Config.ReplicationFactor with its default).
func (c *Controller) ReplicationFactor() int { return c.rf }

// Status is what a Controller reports.
type Status struct {
	// Leader is the raft id of the controller's leader as far as this
	// replica knows (0: none); Term is its term.
	Leader, Term uint64
	// Voters and Learners are the controller group's configuration.
	Voters, Learners []uint64
	// Applied is the index of the last entry applied to Table.
	Applied uint64
	// Table is the committed node table as of Applied.
	Table *Table
	// Err is set once the controller failed (a storage error, or an
	// entry it cannot apply); it then does nothing more.
	Err string
}

// Controller is one node's replica of the controller group: a raft group
// over the cluster's nodes whose committed log is the node table. It is a
// multiraft.Group; its own goroutine stores entries (fsynced before the
// messages of the same Ready leave), applies committed ones and proposes
// the changes Reconcile asks for.
type Controller struct {
	cfg  Config
	log  *slog.Logger
	slog *seglog.Log
	rs   *raftlog.Storage
	rn   *raft.RawNode

	inbound   chan *raftpb.Message
	proposals chan []byte
	ticks     atomic.Int32
	fenced    atomic.Bool // SetFenced
	wake      chan struct{}
	stop      chan struct{}
	done      chan struct{}

	mu    sync.Mutex
	view  []Member  // latest Reconcile input, taken by the loop
	loads NodeLoads // latest SetNodeLoads input (load.go)

	// Loop-owned.
	table     *Table
	applied   uint64
	cs        raftpb.ConfState
	confAt    uint64              // log index of the last conf change proposed
	proposed  map[string]uint64   // command key -> tick when proposed, to avoid repeats
	collided  map[string]struct{} // node ids refused for a raft id collision, logged once
	deadSince map[uint64]uint64   // raft id -> tick when membership first held it dead
	liveSince map[uint64]uint64   // raft id -> tick since when membership has held it live
	rf        int                 // Config.ReplicationFactor with its default
	// planApplied and planView are the applied index and view signature
	// of the last recovery plan; planIdle is set when it proposed
	// nothing and waited on no clock (planRecovery skips the next then).
	planApplied, planView uint64
	planIdle              bool
	usedLoads             NodeLoads         // the loads the recovery plan uses (planLoads)
	lagSince              map[uint64]uint64 // raft id -> tick when a learner was first seen behind (reconcileConf)
	lagWarned             map[uint64]bool   // learners passed over whose lag was logged
	tickN                 uint64            // ticks taken
	leads                 bool
	status                atomic.Pointer[Status]
	failed                error
	changed               chan struct{} // closed and replaced whenever Status changes
	changedMu             sync.Mutex
	closeOnce             sync.Once
	// snap is the last snapshot (zero: none yet), snapData its encoding.
	snap     snap
	snapData []byte

	// Cohorts (cohorts.go). cohortApplied and cohortView are the applied
	// index and view signature of the last cohort plan; cohortIdle is set
	// when it proposed nothing (planCohorts skips the next then).
	cohortApplied, cohortView uint64
	cohortIdle                bool
	// reports is this node's ReportCohort input (under rmu);
	// reportsDirty is set by ReportCohort; reportsApplied is the applied
	// index syncReports last ran at, and reportsRetry the tick it must
	// run again at (0: none).
	rmu                          sync.Mutex
	reports                      map[cohortKey]*localReport
	reportsDirty                 atomic.Bool
	reportsApplied, reportsRetry uint64
	// cohortsCh is closed and replaced whenever the committed plans
	// change (under changedMu); plansSeq is the Table.plansSeq it was
	// last closed for.
	cohortsCh chan struct{}
	plansSeq  uint64
	// reportEntries counts the cohort_report entries applied.
	reportEntries atomic.Uint64
	// cohortPlanRuns counts the runs of planCohorts that were not
	// skipped.
	cohortPlanRuns atomic.Uint64
}

// Open opens (or creates) the controller log in cfg.Dir and starts the
// controller's goroutine.
func Open(cfg Config) (*Controller, error) {
	if cfg.Self.RaftID == 0 || cfg.Self.ID == "" || cfg.Send == nil {
		return nil, errors.New("controller: config needs Self (raft id and id) and Send")
	}
	if cfg.VotersMax <= 0 {
		cfg.VotersMax = VotersMaxDefault
	}
	if cfg.SnapshotEvery <= 0 {
		cfg.SnapshotEvery = SnapshotEveryDefault
	}
	if cfg.SegmentBytes <= 0 {
		cfg.SegmentBytes = segmentBytes
	}
	c := &Controller{
		cfg:       cfg,
		log:       cfg.Logger,
		inbound:   make(chan *raftpb.Message, inboundMax),
		proposals: make(chan []byte, proposalsMax),
		wake:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		table:     &Table{},
		proposed:  map[string]uint64{},
		collided:  map[string]struct{}{},
		deadSince: map[uint64]uint64{},
		liveSince: map[uint64]uint64{},
		rf:        cmp.Or(cfg.ReplicationFactor, ReplicationFactorDefault),
		lagSince:  map[uint64]uint64{},
		lagWarned: map[uint64]bool{},
		changed:   make(chan struct{}),
		reports:   map[cohortKey]*localReport{},
		cohortsCh: make(chan struct{}),
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	l, err := seglog.Open(seglog.Options{FS: cfg.FS, Dir: filepath.Join(cfg.Dir, "log"), SegmentBytes: cfg.SegmentBytes, Logger: c.log})
	if err != nil {
		return nil, fmt.Errorf("controller: open log: %w", err)
	}
	c.slog = l
	c.rs = raftlog.New(l, raftlog.Options{})
	c.rs.SetSnapshotSource(c.raftSnapshot)
	s, data, ok, err := c.loadSnap()
	if err == nil && ok {
		err = c.restoreSnap(s, data)
	}
	if err != nil {
		l.Close()
		return nil, err
	}
	fresh := !ok && l.NextLSN() == 1 && l.HardState().Term == 0
	var rn *raft.RawNode
	err = safely(func() (err error) {
		rn, err = raft.NewRawNode(&raft.Config{
			ID:                        cfg.Self.RaftID,
			ElectionTick:              electionTicks,
			HeartbeatTick:             heartbeatTicks,
			Storage:                   c.rs,
			MaxSizePerMsg:             1 << 20,
			MaxInflightMsgs:           64,
			MaxUncommittedEntriesSize: 1 << 20,
			MaxCommittedSizePerReady:  1 << 20,
			PreVote:                   true,
			CheckQuorum:               true,
			StepDownOnRemoval:         true,
			Applied:                   c.applied,
			Logger:                    raftlog.QuietLogger{},
		})
		return err
	})
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("controller: raft: %w", err)
	}
	c.rn = rn
	if fresh && cfg.Bootstrap {
		if err := rn.Bootstrap([]raft.Peer{{ID: cfg.Self.RaftID}}); err != nil {
			l.Close()
			return nil, fmt.Errorf("controller: bootstrap: %w", err)
		}
	}
	// Open replays the committed log here, on the caller's goroutine.
	if err := safely(c.handleReady); err != nil {
		l.Close()
		return nil, err
	}
	if fresh && cfg.Bootstrap {
		// A group of one elects itself at once.
		err := safely(func() error {
			if err := rn.Campaign(); err != nil {
				return fmt.Errorf("controller: campaign: %w", err)
			}
			return c.handleReady()
		})
		if err != nil {
			l.Close()
			return nil, err
		}
	}
	c.publish()
	go c.run()
	return c, nil
}

// Step queues an inbound raft message (multiraft.Group); it never blocks.
func (c *Controller) Step(m *raftpb.Message) error {
	select {
	case c.inbound <- m:
		c.poke()
	default:
		// Dropped: raft resends.
	}
	return nil
}

// Tick adds one raft tick (multiraft.Group).
func (c *Controller) Tick() {
	c.ticks.Add(1)
	c.poke()
}

// Reconcile hands the controller the membership's current view of the
// nodes. The leader proposes what makes the committed table and the
// group's configuration match it: a join for a live node it does not hold
// (or holds with other addresses; an empty GossipAddr is no change), a
// leave for a node that left on purpose, and one configuration change at
// a time toward VotersMax live voters and every other member a learner:
// a voter reported dead gives its seat to a live learner and stays in
// the table.
func (c *Controller) Reconcile(view []Member) {
	c.mu.Lock()
	c.view = slices.Clone(view)
	c.mu.Unlock()
	c.poke()
}

// SetFenced tells the controller whether its node is fenced (membership
// holds a majority of the peers dead). A fenced leader plans nothing (its
// view holds most nodes dead, though their raft messages may still flow
// when only gossip is cut) and hands its lead to a voter that has caught
// up, when one has; a fenced follower goes on following.
func (c *Controller) SetFenced(fenced bool) {
	if c.fenced.Swap(fenced) != fenced {
		c.poke()
	}
}

// handLeadOver, on a fenced leader, transfers the lead to a voter that
// is recently active and has the whole log, unless a transfer is under
// way.
func (c *Controller) handLeadOver() {
	st := c.rn.Status()
	if st.LeadTransferee != 0 {
		return
	}
	for _, id := range c.cs.Voters {
		if pr, ok := st.Progress[id]; ok && id != c.cfg.Self.RaftID && pr.RecentActive && pr.Match >= st.Commit {
			c.log.Info("controller: this node is fenced; it hands the controller's lead over", "to", id)
			c.rn.TransferLeader(id)
			return
		}
	}
}

// Status returns the controller's latest status.
func (c *Controller) Status() Status { return *c.status.Load() }

// Changed returns a channel closed at the next change of Status.
func (c *Controller) Changed() <-chan struct{} {
	c.changedMu.Lock()
	defer c.changedMu.Unlock()
	return c.changed
}

// Close stops the controller and closes its log.
func (c *Controller) Close() error {
	c.closeOnce.Do(func() { close(c.stop) })
	<-c.done
	return c.slog.Close()
}

func (c *Controller) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Controller) run() {
	defer close(c.done)
	for {
		select {
		case <-c.stop:
			return
		case <-c.wake:
		}
		if c.failed != nil {
			continue
		}
		if err := c.safeTurn(); err != nil {
			c.failed = err
			c.log.Error("controller failed; it does nothing more until the node restarts", "err", err)
			c.publish()
		}
	}
}

// safeTurn runs a turn; etcd raft panics when its storage fails (a read
// error from the disk), which must fail the controller, not the process.
func (c *Controller) safeTurn() error { return safely(c.turn) }

func safely(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("controller: raft stopped: %v", r)
		}
	}()
	return f()
}

func (c *Controller) turn() error {
	for range inboundMax {
		select {
		case m := <-c.inbound:
			if err := c.rn.Step(*m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) && !errors.Is(err, raft.ErrStepLocalMsg) {
				c.log.Debug("controller: step", "err", err)
			}
			continue
		default:
		}
		break
	}
	for n := min(c.ticks.Swap(0), ticksPerTurnMax); n > 0; n-- {
		c.rn.Tick()
		c.tickN++
	}
	if err := c.handleReady(); err != nil {
		return err
	}
	for range proposalsMax {
		select {
		case data := <-c.proposals:
			// Dropped without a leader; the caller proposes again.
			_ = c.rn.Propose(data)
			continue
		default:
		}
		break
	}
	if c.syncReports() {
		if err := c.handleReady(); err != nil {
			return err
		}
	}
	if c.leads && c.fenced.Load() {
		c.handLeadOver()
		if err := c.handleReady(); err != nil {
			return err
		}
	} else if c.leads {
		if err := c.reconcile(); err != nil {
			return err
		}
		if err := c.handleReady(); err != nil {
			return err
		}
	}
	if len(c.inbound) > 0 || c.ticks.Load() > 0 {
		c.poke()
	}
	return nil
}

// handleReady persists, sends and applies everything raft has ready:
// entries and HardState are durable before the messages of the same Ready
// leave.
func (c *Controller) handleReady() error {
	for c.rn.HasReady() {
		rd := c.rn.Ready()
		if rd.SoftState != nil {
			leads := rd.SoftState.RaftState == raft.StateLeader
			if leads != c.leads {
				c.leads = leads
				clear(c.proposed)
				c.cohortIdle = false
				if leads {
					c.log.Info("controller leader", "node", c.cfg.Self.ID, "term", c.rn.BasicStatus().Term)
				}
			}
		}
		if !raft.IsEmptySnap(rd.Snapshot) {
			if err := c.installSnap(&rd.Snapshot); err != nil {
				return err
			}
		}
		if err := c.rs.Append(rd.Entries); err != nil {
			return fmt.Errorf("controller: append: %w", err)
		}
		if !raft.IsEmptyHardState(rd.HardState) {
			if err := c.rs.SetHardState(&rd.HardState); err != nil {
				return fmt.Errorf("controller: hard state: %w", err)
			}
		}
		if len(rd.Entries) > 0 || !raft.IsEmptyHardState(rd.HardState) {
			if err := c.rs.Sync(); err != nil {
				return fmt.Errorf("controller: sync: %w", err)
			}
			if err := c.slog.SyncHardState(); err != nil {
				return fmt.Errorf("controller: sync: %w", err)
			}
		}
		if len(rd.Messages) > 0 {
			out := make([]*raftpb.Message, len(rd.Messages))
			for i := range rd.Messages {
				out[i] = &rd.Messages[i]
			}
			c.cfg.Send(out)
			for _, m := range out {
				if m.Type == raftpb.MsgSnap {
					// The transport does not say whether a message
					// arrived: the leader goes back to probing the
					// follower, which asks again if it was lost.
					c.rn.ReportSnapshot(m.To, raft.SnapshotFinish)
				}
			}
		}
		for i := range rd.CommittedEntries {
			if err := c.applyEntry(&rd.CommittedEntries[i]); err != nil {
				return err
			}
		}
		if len(rd.CommittedEntries) > 0 {
			c.rs.SetApplied(c.applied)
		}
		c.rn.Advance(rd)
		if err := c.maybeSnapshot(); err != nil {
			return err
		}
		c.publish()
	}
	return nil
}

func (c *Controller) applyEntry(e *raftpb.Entry) error {
	c.applied = e.Index
	switch e.Type {
	case raftpb.EntryConfChange:
		var cc raftpb.ConfChange
		if err := cc.Unmarshal(e.Data); err != nil {
			return fmt.Errorf("controller: conf change at %d: %w", e.Index, err)
		}
		// The configuration is not stored apart: a restart replays
		// every committed entry, configuration changes included, from
		// an empty configuration, as the group went through them.
		c.cs = *c.rn.ApplyConfChange(cc)
		c.log.Info("controller configuration", "voters", c.cs.Voters, "learners", c.cs.Learners)
		return nil
	case raftpb.EntryConfChangeV2:
		var cc raftpb.ConfChangeV2
		if err := cc.Unmarshal(e.Data); err != nil {
			return fmt.Errorf("controller: conf change at %d: %w", e.Index, err)
		}
		c.cs = *c.rn.ApplyConfChange(cc)
		return nil
	}
	if len(e.Data) == 0 {
		return nil // a new leader's empty entry
	}
	cmd, err := decode(e.Data)
	if err != nil {
		return fmt.Errorf("controller: entry %d: %w", e.Index, err)
	}
	if err := c.table.apply(e.Index, cmd); err != nil {
		return fmt.Errorf("controller: entry %d: %w", e.Index, err)
	}
	if cmd.Op == opCohortReport {
		c.reportEntries.Add(1)
	}
	return nil
}

// reconcile proposes, as leader, what the latest view asks for (see
// Reconcile). Commands already proposed in this term and not yet visible
// in the table are not proposed again.
func (c *Controller) reconcile() error {
	c.mu.Lock()
	view := c.view
	c.mu.Unlock()
	for _, m := range view {
		if m.Dead {
			continue // joins come from live nodes, leaves from nodes that left
		}
		cur, known := c.table.Node(m.RaftID)
		if known && cur.ID != m.ID {
			if _, warned := c.collided[m.ID]; !warned {
				c.collided[m.ID] = struct{}{}
				c.log.Error("controller: a node id shares its raft id with another node's; it is not admitted (give it a new data directory, hence a new id)",
					"node_id", m.ID, "other_node_id", cur.ID, "raft_id", m.RaftID)
			}
			continue
		}
		var cmd command
		switch {
		case m.Gone && known && !cur.Left:
			cmd = command{Op: opLeave, RaftID: m.RaftID, Boot: m.Boot}
		case !m.Gone && known && cur.Left && cur.Boot == m.Boot:
			// The run that left, alive while it hands its replicas over
			// (or seen through a view from before its leave): not back.
			continue
		case !m.Gone && (!known || cur.Left || cur.ClientAddr != m.ClientAddr || cur.PeerAddr != m.PeerAddr || cur.Boot != m.Boot ||
			(m.GossipAddr != "" && cur.GossipAddr != m.GossipAddr)):
			// An unknown gossip address (empty) changes nothing: the
			// table keeps the last one heard.
			n := m.Node
			n.JoinedAt, n.Left = 0, false
			cmd = command{Op: opJoin, Node: &n}
		default:
			continue
		}
		key := fmt.Sprintf("%s/%d/%s/%s/%s/%d", cmd.Op, m.RaftID, m.ClientAddr, m.PeerAddr, m.GossipAddr, m.Boot)
		if _, ok := c.proposed[key]; ok {
			continue
		}
		data, err := encode(cmd)
		if err != nil {
			return err
		}
		if err := c.rn.Propose(data); err != nil {
			return nil // lost the lead meanwhile; the next leader reconciles
		}
		c.proposed[key] = c.tickN
	}
	if err := c.planRecovery(view); err != nil {
		return err
	}
	if err := c.planCohorts(view); err != nil {
		return err
	}
	// A proposal not seen in the table within proposeRetryTicks (lost
	// with a term change) may be proposed again.
	for k, at := range c.proposed {
		if c.tickN > at+proposeRetryTicks {
			delete(c.proposed, k)
		}
	}
	return c.reconcileConf()
}

// reconcileConf proposes at most one configuration change toward
// VotersMax live voters, in join order, and every other member a learner.
// It never removes a node the table does not hold (the bootstrap voter
// before its own join is applied).
func (c *Controller) reconcileConf() error {
	// One change at a time: every entry in the log, the last change
	// proposed included, is applied first. (raft itself would turn a
	// change proposed while another is pending into an empty entry.)
	last, err := c.rs.LastIndex()
	if err != nil || c.applied < max(last, c.confAt) {
		return nil
	}
	c.mu.Lock()
	dead := map[uint64]bool{}
	for _, m := range c.view {
		if m.Dead {
			dead[m.RaftID] = true
		}
	}
	c.mu.Unlock()
	members := c.table.members()
	isVoter := func(id uint64) bool { return slices.Contains(c.cs.Voters, id) }
	isLearner := func(id uint64) bool { return slices.Contains(c.cs.Learners, id) }
	// A live member that does not vote and could: a learner this leader
	// hears from whose log has caught up. A member is never made a voter
	// before that, so a node that gossips but whose raft messages do not
	// arrive (a wrong peer CA, a blocked peer port) never takes a seat
	// it cannot fill.
	// Members are taken in join order; one that has lagged for
	// lagSkipTicks is passed over, so that it does not hold the others
	// back.
	var standby uint64
	rs := c.rn.Status()
	for _, id := range members {
		if isVoter(id) || dead[id] || !isLearner(id) {
			continue
		}
		if pr, ok := rs.Progress[id]; ok && pr.RecentActive && pr.Match >= rs.Commit {
			delete(c.lagSince, id)
			delete(c.lagWarned, id)
			standby = id
			break
		}
		since, ok := c.lagSince[id]
		if !ok {
			since = c.tickN
			c.lagSince[id] = since
		}
		if c.tickN < since+lagSkipTicks {
			break // wait for it to catch up
		}
		if !c.lagWarned[id] {
			c.lagWarned[id] = true
			c.log.Warn("controller: a member does not catch up; it stays a learner (can this node reach its peer address, and does its peer certificate come from the peers' CA and name its node id?)",
				"raft_id", id)
		}
	}
	var cc *raftpb.ConfChange
	// 1. A node that left is removed, once the recovery plan has moved
	// its replicas away: until then it still hands them over (its
	// partitions' owners read their placement from this group).
	for _, id := range slices.Concat(c.cs.Voters, c.cs.Learners) {
		if n, ok := c.table.Node(id); ok && n.Left && !c.table.holdsReplicas(id) {
			cc = &raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: id}
			break
		}
	}
	// 2. A voter membership holds dead becomes a learner when a live
	// member can take its seat (step 3, next): the group keeps
	// VotersMax live voters through a lost node. Demoting first keeps
	// each change's quorum within the live nodes. The node stays in the
	// table and the group, and is a learner when it comes back.
	if cc == nil && standby != 0 {
		for _, id := range c.cs.Voters {
			if dead[id] && len(c.cs.Voters) > 1 {
				cc = &raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode, NodeID: id}
				break
			}
		}
	}
	// 3. Up to VotersMax voters: the first live members in join order.
	if cc == nil && len(c.cs.Voters) < c.cfg.VotersMax && standby != 0 {
		cc = &raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: standby}
	}
	// 4. Every other member is a learner, so every node holds the table.
	if cc == nil {
		for _, id := range members {
			if !isVoter(id) && !isLearner(id) {
				cc = &raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode, NodeID: id}
				break
			}
		}
	}
	if cc == nil {
		return nil
	}
	if err := c.rn.ProposeConfChange(*cc); err != nil {
		return nil // lost the lead meanwhile
	}
	if err := c.handleReady(); err != nil {
		return err
	}
	c.confAt, _ = c.rs.LastIndex()
	return nil
}

// lagSkipTicks is how long a learner may stay behind before reconcileConf
// passes it over for a voter's seat (10 s at the raft host's 50 ms tick).
const lagSkipTicks = 200

// publish stores a fresh Status and wakes Changed's waiters.
func (c *Controller) publish() {
	bs := c.rn.BasicStatus()
	if prev := c.status.Load(); prev != nil && prev.Leader == bs.Lead && prev.Term == bs.Term && prev.Applied == c.applied &&
		slices.Equal(prev.Voters, c.cs.Voters) && slices.Equal(prev.Learners, c.cs.Learners) && (c.failed == nil) == (prev.Err == "") {
		// Nothing a reader sees changed (the table changes only with
		// Applied): a heartbeat's Ready neither copies the table nor
		// wakes those that wait on Changed.
		return
	}
	st := &Status{
		Leader:   bs.Lead,
		Term:     bs.Term,
		Voters:   slices.Clone(c.cs.Voters),
		Learners: slices.Clone(c.cs.Learners),
		Applied:  c.applied,
		Table:    c.table.clone(),
	}
	if c.failed != nil {
		st.Err = c.failed.Error()
	}
	c.status.Store(st)
	c.changedMu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	if c.table.plansSeq != c.plansSeq {
		c.plansSeq = c.table.plansSeq
		close(c.cohortsCh)
		c.cohortsCh = make(chan struct{})
	}
	c.changedMu.Unlock()
}
