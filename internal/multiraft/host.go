package multiraft

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Group is one replica of one raft group, driven by a Host.
type Group interface {
	// Step hands the replica one inbound raft message. It is called on the
	// host's loop and must not block on I/O: a replica with its own
	// goroutine queues the message (bounded, dropping when full, as raft
	// tolerates loss).
	Step(m *raftpb.Message) error
	// Tick advances the replica's raft clock by one tick.
	Tick()
}

// Quieter is a Group that can say it needs no tick now: a group of one
// (it is its own quorum, so it never holds an election or sends a
// heartbeat), or a group with nothing to do. For a quiet group a host tick
// costs one Quiet call.
type Quieter interface {
	Quiet() bool
}

// Waker is a Quieter that says when it stops being quiet: the host hands
// it wake, which it calls (from any goroutine, after Quiet turned false)
// when it needs ticks again. A quiet Waker then costs the host nothing at
// a tick, not even a Quiet call: the host asks only the groups it does
// not know quiet.
type Waker interface {
	UseWake(wake func())
}

// LivenessWatcher is a Group told, on the host loop, which peer nodes
// changed liveness (Live turned true or false) since the last host tick.
// A quiet group whose replicas sit on one of them wakes: a follower whose
// leader's node died must run its election timer, and a leader whose
// follower came back must catch it up. The host calls it at the start of
// the tick, before it asks Quiet.
type LivenessWatcher interface {
	LivenessChanged(nodes []uint64)
}

// LiveUser is a Group that needs the host's Live function to decide when
// it may be quiet: AddGroup hands it over.
type LiveUser interface {
	UseLive(live func(node uint64) bool)
}

// Clock is the time source of Run: After returns a channel that receives
// once d has passed. internal/testkit's fake clock implements it.
type Clock interface {
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Default limits of a Config left at zero.
const (
	// InboxMsgsMaxDefault bounds one group's inbound messages waiting for
	// the host loop.
	InboxMsgsMaxDefault = 1024
	// OutboxMsgsMaxDefault bounds the messages waiting for one peer node
	// between two flushes.
	OutboxMsgsMaxDefault = 16384
	// TickMsDefault is Run's tick interval.
	TickMsDefault = 100
	// PeerLiveTicksDefault is Config.PeerLiveTicks when left zero.
	PeerLiveTicksDefault = 10
)

// Config configures a Host.
type Config struct {
	// NodeID is this node's id; a group's replica on this node has this
	// raft id.
	NodeID uint64
	// Transport carries outbound batches to peer nodes.
	Transport Transport
	// InboxMsgsMax bounds each group's inbound messages between two
	// Process calls; beyond it messages are dropped and counted.
	InboxMsgsMax int
	// OutboxMsgsMax bounds the messages queued for one peer node between
	// two Flush calls; beyond it messages are dropped and counted.
	OutboxMsgsMax int
	// TickMs is the interval between two ticks in Run.
	TickMs int
	// PeerLiveTicks is how many host ticks a peer node stays live after
	// the host last heard from it (Live). Every tick the host sends each
	// known peer one node heartbeat, whatever the number of groups.
	PeerLiveTicks int
	// Clock drives Run's ticks; nil means the real clock.
	Clock Clock
}

// HostStats counts what a Host did. Read it with Host.Stats.
type HostStats struct {
	// Groups is the number of groups hosted.
	Groups int
	// Ticks is host ticks; GroupTicks is Tick calls made to groups, and
	// QuietSkips is groups skipped because they were quiet.
	Ticks, GroupTicks, QuietSkips uint64
	// Received is inbound messages routed to a group's inbox.
	Received uint64
	// InboxDropped is inbound messages dropped because the group's inbox
	// was full; UnknownGroup is those for a group not hosted here.
	InboxDropped, UnknownGroup uint64
	// StepErrors is Step calls that returned an error.
	StepErrors uint64
	// Sent is outbound messages handed to the transport, in Batches calls
	// of Transport.Send; OutboxDropped is those dropped because a peer's
	// outbox was full.
	Sent, Batches, OutboxDropped uint64
	// NodeHeartbeats is node heartbeats queued (one per known peer per
	// tick); they are part of Sent.
	NodeHeartbeats uint64
	// LivenessChanges is peer liveness changes (Live turning true or
	// false) the host passed to its groups (LivenessWatcher).
	LivenessChanges uint64
}

// ErrGroupExists is returned by AddGroup for a group id already hosted.
var ErrGroupExists = errors.New("multiraft: group already hosted")

// ErrGroupZero is returned by AddGroup for group id 0, which carries the
// host's own node heartbeats.
var ErrGroupZero = errors.New("multiraft: group id 0 is reserved")

// nodeGroup is the envelope group id of host-to-host node heartbeats.
const nodeGroup = 0

type slot struct {
	id      uint64
	g       Group
	quiet   Quieter         // nil when g cannot be quiet
	watcher LivenessWatcher // nil when g does not watch liveness
	inbox   []*raftpb.Message
	busy    []*raftpb.Message // the batch Process is stepping, outside mu
	queued  bool              // in h.ready
	removed bool
	waker   bool // g is a Waker: a quiet one leaves the awake list
	inAwake bool // in h.awake (host loop only)
	pending bool // in h.woken (under h.wokenMu)
}

// Host drives every raft group replica on one node: one tick for all
// groups, inbound messages routed by group id into bounded inboxes, and
// outbound messages of all groups batched per peer node, one
// Transport.Send per peer per flush.
//
// Goroutines: Tick, Process and Flush are the host loop and must be called
// from one goroutine at a time (Run does that; a deterministic test calls
// them itself). Deliver, the functions returned by Sender, AddGroup,
// RemoveGroup and Stats are safe from any goroutine. Group methods are
// only called from the host loop, never with h.mu held.
type Host struct {
	cfg  Config
	wake chan struct{}

	mu         sync.Mutex
	slots      map[uint64]*slot
	order      []*slot // tick order by group id; replaced, never edited in place
	ready      []*slot // groups with inbound messages since the last Process
	readySpare []*slot
	outbox     map[uint64][]Envelope
	peers      []uint64          // peers with a non-empty outbox, in first-send order
	known      []uint64          // every peer node sent to or heard from, in first-seen order
	lastHeard  map[uint64]uint64 // peer node -> host tick it was last heard from
	lastSent   map[uint64]uint64 // peer node -> host tick something was last queued for it
	down       map[uint64]bool   // peer nodes membership reports dead or left (SetPeerDown)
	wasLive    map[uint64]bool   // Live of each known peer at the last tick
	tickN      uint64            // host ticks so far

	// awake lists the groups Tick asks (host loop only): every group
	// but the quiet Wakers. woken holds the groups added, or woken since
	// the last tick, that Tick moves there.
	awake   []*slot
	wokenMu sync.Mutex
	woken   []*slot

	ticks, groupTicks, quietSkips         atomic.Uint64
	received, inboxDropped, unknownGroup  atomic.Uint64
	stepErrors, sent, batches, outDropped atomic.Uint64
	nodeBeats, liveChanges                atomic.Uint64
}

// NewHost returns a host for cfg.
func NewHost(cfg Config) (*Host, error) {
	if cfg.NodeID == 0 {
		return nil, errors.New("multiraft: Config.NodeID must not be 0")
	}
	if cfg.Transport == nil {
		return nil, errors.New("multiraft: Config.Transport is nil")
	}
	if cfg.InboxMsgsMax <= 0 {
		cfg.InboxMsgsMax = InboxMsgsMaxDefault
	}
	if cfg.OutboxMsgsMax <= 0 {
		cfg.OutboxMsgsMax = OutboxMsgsMaxDefault
	}
	if cfg.TickMs <= 0 {
		cfg.TickMs = TickMsDefault
	}
	if cfg.PeerLiveTicks <= 0 {
		cfg.PeerLiveTicks = PeerLiveTicksDefault
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	return &Host{
		cfg:       cfg,
		wake:      make(chan struct{}, 1),
		slots:     make(map[uint64]*slot),
		outbox:    make(map[uint64][]Envelope),
		lastHeard: make(map[uint64]uint64),
		lastSent:  make(map[uint64]uint64),
		down:      make(map[uint64]bool),
		wasLive:   make(map[uint64]bool),
	}, nil
}

// NodeID returns the host's node id.
func (h *Host) NodeID() uint64 { return h.cfg.NodeID }

// AddGroup hosts g as group id. Messages for id received before AddGroup
// were dropped (counted as UnknownGroup); raft resends them.
func (h *Host) AddGroup(id uint64, g Group) error {
	if id == nodeGroup {
		return ErrGroupZero
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.slots[id]; ok {
		return fmt.Errorf("%w: %d", ErrGroupExists, id)
	}
	s := &slot{id: id, g: g}
	s.quiet, _ = g.(Quieter)
	s.watcher, _ = g.(LivenessWatcher)
	if u, ok := g.(LiveUser); ok {
		u.UseLive(h.Live)
	}
	if w, ok := g.(Waker); ok && s.quiet != nil {
		s.waker = true
		w.UseWake(func() { h.woke(s) })
	}
	h.woke(s)
	h.slots[id] = s
	i, _ := slices.BinarySearchFunc(h.order, id, func(s *slot, id uint64) int {
		switch {
		case s.id < id:
			return -1
		case s.id > id:
			return 1
		}
		return 0
	})
	h.order = slices.Insert(slices.Clone(h.order), i, s)
	return nil
}

// RemoveGroup stops hosting group id; its queued inbound messages are
// discarded. It reports whether the group was hosted.
func (h *Host) RemoveGroup(id uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.slots[id]
	if !ok {
		return false
	}
	s.removed = true
	s.inbox = nil
	delete(h.slots, id)
	h.order = slices.DeleteFunc(slices.Clone(h.order), func(x *slot) bool { return x == s })
	return true
}

// Deliver routes an inbound batch from peer node from to each envelope's
// group inbox. It never blocks: a message for a group not hosted here, or
// for a group whose inbox is full, is dropped and counted.
func (h *Host) Deliver(from uint64, batch []Envelope) {
	h.mu.Lock()
	// Anything from a node, a node heartbeat or a group's message, shows
	// it is up.
	h.heardLocked(from)
	for _, env := range batch {
		if env.Group == nodeGroup {
			continue
		}
		h.routeLocked(env)
	}
	h.mu.Unlock()
	h.signal()
}

func (h *Host) heardLocked(node uint64) {
	if _, ok := h.lastHeard[node]; !ok {
		h.knowLocked(node)
	}
	h.lastHeard[node] = h.tickN
}

func (h *Host) knowLocked(node uint64) {
	if node != h.cfg.NodeID && !slices.Contains(h.known, node) {
		h.known = append(h.known, node)
	}
}

// Live reports whether node was heard from (any message) within the last
// PeerLiveTicks host ticks and membership does not report it dead or left
// (SetPeerDown). This node is always live. Groups use it to decide
// whether they may be quiet (Quiescence).
func (h *Host) Live(node uint64) bool {
	if node == h.cfg.NodeID {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.liveLocked(node)
}

func (h *Host) liveLocked(node uint64) bool {
	t, ok := h.lastHeard[node]
	return ok && h.tickN-t <= uint64(h.cfg.PeerLiveTicks) && !h.down[node]
}

// SetPeerDown records what membership says of peer node: down is true
// while it is dead or has left. A down node is not Live even while its
// messages still arrive. The change reaches the groups (LivenessWatcher)
// at the next host tick. Safe from any goroutine.
func (h *Host) SetPeerDown(node uint64, down bool) {
	if node == h.cfg.NodeID {
		return
	}
	h.mu.Lock()
	if down {
		h.down[node] = true
	} else {
		delete(h.down, node)
	}
	h.mu.Unlock()
}

// livenessChangesLocked returns the known peers whose Live changed since
// the last tick. A peer first heard of counts as a change when it is
// live: until then it was not.
func (h *Host) livenessChangesLocked() []uint64 {
	var changed []uint64
	for _, p := range h.known {
		live := h.liveLocked(p)
		if h.wasLive[p] != live {
			h.wasLive[p] = live
			changed = append(changed, p)
		}
	}
	return changed
}

func (h *Host) routeLocked(env Envelope) {
	s, ok := h.slots[env.Group]
	if !ok || env.Msg == nil {
		h.unknownGroup.Add(1)
		return
	}
	if len(s.inbox) >= h.cfg.InboxMsgsMax {
		h.inboxDropped.Add(1)
		return
	}
	s.inbox = append(s.inbox, env.Msg)
	h.received.Add(1)
	if !s.queued {
		s.queued = true
		h.ready = append(h.ready, s)
	}
}

func (h *Host) signal() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Sender returns the function group id's replica sends its outbound
// messages with (for a partition, its Config.Send). Messages are queued
// per peer node until the next Flush; a message to this node itself is
// routed to the group's inbox. It never blocks: beyond OutboxMsgsMax a
// message is dropped and counted.
func (h *Host) Sender(id uint64) func([]*raftpb.Message) {
	return func(msgs []*raftpb.Message) {
		h.mu.Lock()
		for _, m := range msgs {
			to := m.To
			env := Envelope{Group: id, Msg: m}
			if to == h.cfg.NodeID {
				h.routeLocked(env)
				continue
			}
			h.knowLocked(to)
			h.queueLocked(to, env)
		}
		h.mu.Unlock()
		h.signal()
	}
}

func (h *Host) queueLocked(to uint64, env Envelope) bool {
	q := h.outbox[to]
	if len(q) >= h.cfg.OutboxMsgsMax {
		h.outDropped.Add(1)
		return false
	}
	if len(q) == 0 {
		h.peers = append(h.peers, to)
	}
	h.outbox[to] = append(q, env)
	h.lastSent[to] = h.tickN
	return true
}

// nodeBeatQuietTicks is how many ticks after something was queued for a
// peer no node heartbeat follows it: a quarter of PeerLiveTicks (rounded
// down), so a peer hears from this node at least every quarter plus one
// tick and its view of this node stays live through two lost or late
// heartbeats, while a peer that gets groups' messages that often gets no
// node heartbeat besides them. With PeerLiveTicks under 4, every tick
// sends one.
func (h *Host) nodeBeatQuietTicks() uint64 {
	return uint64(h.cfg.PeerLiveTicks / 4)
}

// Tick queues a node heartbeat for every known peer node that nothing was
// queued for in the last nodeBeatQuietTicks ticks, and gives every hosted group
// one raft tick, skipping quiet ones (host loop only).
func (h *Host) Tick() {
	h.mu.Lock()
	h.tickN++
	changed := h.livenessChangesLocked()
	order := h.order
	from := h.cfg.NodeID
	typ := raftpb.MsgHeartbeat
	quietFor := h.nodeBeatQuietTicks()
	for _, p := range h.known {
		if t, ok := h.lastSent[p]; ok && h.tickN-t <= quietFor {
			continue // what went to p lately shows it this node is up
		}
		if h.queueLocked(p, Envelope{Group: nodeGroup, Msg: &raftpb.Message{Type: typ, From: from, To: p}}) {
			h.nodeBeats.Add(1)
		}
	}
	h.mu.Unlock()
	h.ticks.Add(1)
	if len(changed) > 0 {
		h.liveChanges.Add(uint64(len(changed)))
		for _, s := range order {
			if s.watcher != nil {
				s.watcher.LivenessChanged(changed)
			}
		}
	}
	h.wokenMu.Lock()
	woken := h.woken
	h.woken = nil
	for _, s := range woken {
		s.pending = false
	}
	h.wokenMu.Unlock()
	for _, s := range woken {
		if !s.inAwake && !s.removed {
			s.inAwake = true
			h.awake = append(h.awake, s)
		}
	}
	var ticked uint64
	n := 0
	for _, s := range h.awake {
		switch {
		case s.removed:
			s.inAwake = false
			continue
		case s.quiet != nil && s.quiet.Quiet():
			if s.waker {
				// It says when it wakes (woke); a wake after this
				// Quiet call puts it back at the next tick.
				s.inAwake = false
				continue
			}
		default:
			s.g.Tick()
			ticked++
		}
		h.awake[n] = s
		n++
	}
	clear(h.awake[n:])
	h.awake = h.awake[:n]
	h.groupTicks.Add(ticked)
	h.quietSkips.Add(uint64(len(order)) - ticked)
}

// woke puts s on the list Tick moves to the awake ones (any goroutine).
func (h *Host) woke(s *slot) {
	h.wokenMu.Lock()
	if !s.pending {
		s.pending = true
		h.woken = append(h.woken, s)
	}
	h.wokenMu.Unlock()
}

// Process steps every queued inbound message into its group, in arrival
// order per group (host loop only). It returns the number of messages
// stepped.
func (h *Host) Process() int {
	h.mu.Lock()
	ready := h.ready
	h.ready, h.readySpare = h.readySpare[:0], nil
	for _, s := range ready {
		s.queued = false
		if s.removed {
			s.busy = s.busy[:0]
			continue
		}
		s.busy, s.inbox = s.inbox, s.busy[:0]
	}
	h.mu.Unlock()
	n := 0
	for _, s := range ready {
		for _, m := range s.busy {
			if err := s.g.Step(m); err != nil {
				h.stepErrors.Add(1)
			}
		}
		n += len(s.busy)
		clear(s.busy)
	}
	clear(ready)
	h.mu.Lock()
	if h.readySpare == nil {
		h.readySpare = ready[:0]
	}
	h.mu.Unlock()
	return n
}

// Flush hands each peer node's queued messages to the transport in one
// Send (host loop only). It returns the number of messages sent.
func (h *Host) Flush() int {
	h.mu.Lock()
	peers := h.peers
	h.peers = nil
	batches := make([][]Envelope, len(peers))
	for i, p := range peers {
		batches[i] = h.outbox[p]
		delete(h.outbox, p)
	}
	h.mu.Unlock()
	n := 0
	for i, p := range peers {
		h.cfg.Transport.Send(p, batches[i])
		n += len(batches[i])
	}
	h.sent.Add(uint64(n))
	h.batches.Add(uint64(len(peers)))
	return n
}

// runRoundsMax bounds the process/flush rounds Run makes per wake-up.
const runRoundsMax = 64

// Run is the host loop: every TickMs it ticks all groups, and whenever
// messages arrive or are sent it processes and flushes. It returns when
// ctx ends.
func (h *Host) Run(ctx context.Context) error {
	every := time.Duration(h.cfg.TickMs) * time.Millisecond
	tick := h.cfg.Clock.After(every)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			h.Tick()
			tick = h.cfg.Clock.After(every)
		case <-h.wake:
		}
		// Processing queues outbound messages and a flush to this node
		// queues inbound ones; go round until both are empty, a bounded
		// number of times so a busy node still ticks (the wake channel
		// brings the loop back for what is left).
		for range runRoundsMax {
			if h.Process()+h.Flush() == 0 {
				break
			}
		}
	}
}

// Stats returns the host's counters.
func (h *Host) Stats() HostStats {
	h.mu.Lock()
	groups := len(h.slots)
	h.mu.Unlock()
	return HostStats{
		Groups:         groups,
		Ticks:          h.ticks.Load(),
		GroupTicks:     h.groupTicks.Load(),
		QuietSkips:     h.quietSkips.Load(),
		Received:       h.received.Load(),
		InboxDropped:   h.inboxDropped.Load(),
		UnknownGroup:   h.unknownGroup.Load(),
		StepErrors:     h.stepErrors.Load(),
		Sent:           h.sent.Load(),
		Batches:        h.batches.Load(),
		OutboxDropped:  h.outDropped.Load(),
		NodeHeartbeats: h.nodeBeats.Load(),

		LivenessChanges: h.liveChanges.Load(),
	}
}
