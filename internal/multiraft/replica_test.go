package multiraft

import (
	"fmt"
	"io"
	"log"
	"slices"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// memReplica is a replicated state machine for the host tests: a RawNode
// over raft.MemoryStorage whose state is the list of applied entries. It
// handles every Ready at once on the host loop, persisting to its storage
// before it sends, so the storage is what a crash keeps.
type memReplica struct {
	id, group uint64
	single    bool
	st        *raft.MemoryStorage
	rn        *raft.RawNode
	send      func([]*raftpb.Message)
	hist      *history // nil: no checking
	applied   uint64   // index of the last applied entry
	values    []string // applied non-empty normal entries, in order
	ticks     int
	quiesce   Quiescence
	live      func(node uint64) bool // the host's Live
}

var quietLogger = &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}

// raftConfig is the configuration the partition contract asks for:
// PreVote, CheckQuorum for groups of more than one, bounded messages,
// inflight, uncommitted and committed-per-Ready sizes.
func raftConfig(id uint64, st raft.Storage, voters int) *raft.Config {
	return &raft.Config{
		ID:                        id,
		ElectionTick:              10,
		HeartbeatTick:             1,
		Storage:                   st,
		MaxSizePerMsg:             64 << 10,
		MaxCommittedSizePerReady:  256 << 10,
		MaxUncommittedEntriesSize: 1 << 20,
		MaxInflightMsgs:           64,
		PreVote:                   true,
		CheckQuorum:               voters > 1,
		Logger:                    quietLogger,
	}
}

// bootstrapStorage returns a storage holding the group's initial
// membership as a snapshot at index 1, term 1, as every replica of a new
// group starts.
func bootstrapStorage(voters []uint64) *raft.MemoryStorage {
	st := raft.NewMemoryStorage()
	if err := st.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{
		Index: 1, Term: 1, ConfState: raftpb.ConfState{Voters: slices.Clone(voters)},
	}}); err != nil {
		panic(err)
	}
	return st
}

// newMemReplica starts (or, on an existing storage, restarts) replica id of
// group over st. A group of one campaigns at once.
func newMemReplica(id, group uint64, voters int, st *raft.MemoryStorage, send func([]*raftpb.Message), live func(uint64) bool, hist *history) (*memReplica, error) {
	rn, err := raft.NewRawNode(raftConfig(id, st, voters))
	if err != nil {
		return nil, err
	}
	r := &memReplica{id: id, group: group, single: voters == 1, st: st, rn: rn, send: send, live: live, hist: hist}
	r.applied, _ = st.FirstIndex()
	r.applied-- // the snapshot is applied state
	if r.single {
		if err := rn.Campaign(); err != nil {
			return nil, err
		}
		r.handleReady()
	}
	return r, nil
}

// Step implements Group.
func (r *memReplica) Step(m *raftpb.Message) error {
	r.quiesce.Observe(m, r.rn.BasicStatus().Lead)
	err := r.rn.Step(*m)
	r.handleReady()
	return err
}

// Tick implements Group.
func (r *memReplica) Tick() {
	r.ticks++
	r.rn.Tick()
	r.handleReady()
}

// Quiet implements Quieter: a group of one is its own quorum and never
// needs a tick; a larger group is quiet when Quiescence says it is idle.
func (r *memReplica) Quiet() bool {
	if r.single {
		return true
	}
	last, _ := r.st.LastIndex()
	return r.quiesce.Quiet(r.rn, last, r.live)
}

func (r *memReplica) propose(v string) error {
	r.quiesce.Wake()
	err := r.rn.Propose([]byte(v))
	r.handleReady()
	return err
}

func (r *memReplica) leader() bool { return r.rn.BasicStatus().RaftState == raft.StateLeader }

func (r *memReplica) handleReady() {
	for r.rn.HasReady() {
		rd := r.rn.Ready()
		if !raft.IsEmptySnap(rd.Snapshot) {
			if err := r.st.ApplySnapshot(rd.Snapshot); err != nil {
				panic(err)
			}
		}
		if !raft.IsEmptyHardState(rd.HardState) {
			if err := r.st.SetHardState(rd.HardState); err != nil {
				panic(err)
			}
		}
		if err := r.st.Append(rd.Entries); err != nil {
			panic(err)
		}
		if len(rd.Messages) > 0 && r.send != nil {
			r.send(msgPtrs(rd.Messages))
		}
		for i := range rd.CommittedEntries {
			r.apply(&rd.CommittedEntries[i])
		}
		r.rn.Advance(rd)
	}
}

// msgPtrs returns pointers to the messages of a Ready, for a Sender. Raft
// does not reuse a Ready's Messages after it hands them out.
func msgPtrs(msgs []raftpb.Message) []*raftpb.Message {
	out := make([]*raftpb.Message, len(msgs))
	for i := range msgs {
		out[i] = &msgs[i]
	}
	return out
}

func (r *memReplica) apply(e *raftpb.Entry) {
	if e.Index != r.applied+1 && r.hist != nil {
		r.hist.fail("group %d replica %d applied index %d after %d", r.group, r.id, e.Index, r.applied)
	}
	r.applied = e.Index
	// These tests make no configuration changes, so every entry is normal:
	// a leader's empty entry or a proposal.
	if e.Type == raftpb.EntryNormal && len(e.Data) > 0 {
		r.values = append(r.values, string(e.Data))
	}
	if r.hist != nil {
		r.hist.observe(r.id, e)
	}
}

// history is one group's committed sequence as the replicas applied it:
// the first replica to apply an index fixes what every replica must apply
// there. A committed entry lost or reordered on any replica, or two
// replicas applying different entries at one index, fails the test.
type history struct {
	group   uint64
	fail    func(format string, args ...any)
	entries map[uint64]entryID
	last    uint64 // highest index applied anywhere
}

type entryID struct {
	term uint64
	data string
}

func newHistory(group uint64, fail func(string, ...any)) *history {
	return &history{group: group, fail: fail, entries: make(map[uint64]entryID)}
}

func (h *history) observe(replica uint64, e *raftpb.Entry) {
	id := entryID{e.Term, string(e.Data)}
	if got, ok := h.entries[e.Index]; ok {
		if got != id {
			h.fail("group %d: replica %d applied %v at index %d, another replica applied %v",
				h.group, replica, id, e.Index, got)
		}
		return
	}
	// The first to apply an index extends the history by one: anything
	// else means a committed entry was skipped.
	if h.last != 0 && e.Index != h.last+1 {
		h.fail("group %d: replica %d applied index %d, history ends at %d", h.group, replica, e.Index, h.last)
	}
	h.entries[e.Index] = id
	h.last = max(h.last, e.Index)
}

func (h *history) String() string { return fmt.Sprintf("group %d: %d entries", h.group, h.last) }
