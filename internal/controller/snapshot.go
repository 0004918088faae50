package controller

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"path/filepath"
	"slices"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/vfs"
)

// ErrDamaged reports a controller snapshot that fails its checksum or does
// not decode.
var ErrDamaged = errors.New("controller: damaged snapshot")

// snapshotFile is the file, beside the log directory, that holds the last
// snapshot: the table and the group's configuration as of an index.
const snapshotFile = "snapshot"

// snapshotBytesMax bounds a snapshot read from disk or from a peer.
const snapshotBytesMax = 64 << 20

// SnapshotEveryDefault is how many applied entries the controller lets
// pass between two snapshots.
const SnapshotEveryDefault = 1024

// snapshotVersion is the encoding version of a snapshot.
const snapshotVersion = 1

// snap is a snapshot of the controller's state.
type snap struct {
	V     int              `json:"v"`
	Index uint64           `json:"index"`
	Term  uint64           `json:"term"`
	Conf  raftpb.ConfState `json:"conf"`
	Table Table            `json:"table"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeSnap encodes s as a CRC-32C (little endian) of the JSON, then the
// JSON: the same bytes go to the snapshot file and into a raft snapshot.
func encodeSnap(s snap) ([]byte, error) {
	s.V = snapshotVersion
	j, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, 4+len(j)), crc32.Checksum(j, castagnoli))
	return append(b, j...), nil
}

func decodeSnap(b []byte) (snap, error) {
	var s snap
	if len(b) < 5 {
		return s, fmt.Errorf("%w: %d bytes", ErrDamaged, len(b))
	}
	if crc32.Checksum(b[4:], castagnoli) != binary.LittleEndian.Uint32(b) {
		return s, fmt.Errorf("%w: checksum mismatch", ErrDamaged)
	}
	if err := json.Unmarshal(b[4:], &s); err != nil {
		return s, fmt.Errorf("%w: %w", ErrDamaged, err)
	}
	if s.V != snapshotVersion {
		return s, fmt.Errorf("%w: version %d", ErrDamaged, s.V)
	}
	return s, nil
}

// loadSnap reads the snapshot file; ok is false when there is none.
func (c *Controller) loadSnap() (s snap, data []byte, ok bool, err error) {
	data, err = vfs.ReadFileMax(c.cfg.FS, filepath.Join(c.cfg.Dir, snapshotFile), snapshotBytesMax)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil, false, nil
	}
	if err != nil {
		return s, nil, false, fmt.Errorf("controller: read snapshot: %w", err)
	}
	s, err = decodeSnap(data)
	return s, data, err == nil, err
}

// restoreSnap makes s (read from disk at Open) the state the log continues
// from. The snapshot file is written before the configuration is stored
// with the log, so after a crash between the two the file is the newer:
// the stored configuration is repaired from it.
func (c *Controller) restoreSnap(s snap, data []byte) error {
	if first := c.slog.FirstLSN(); first > s.Index+1 {
		return fmt.Errorf("%w: the log starts at %d, after the snapshot at %d", ErrDamaged, first, s.Index)
	}
	cur, err := c.slog.ConfState()
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	if !confEqual(*cur, s.Conf) {
		if err := c.slog.SetConfState(&s.Conf); err != nil {
			return fmt.Errorf("controller: %w", err)
		}
	}
	// The entries up to the snapshot were committed; a commit index
	// stored lazily (raft's commit alone is not synced at once) may lag
	// behind it, and raft refuses to start applied past its commit.
	if hs := c.slog.HardState(); hs.Commit < s.Index {
		hs.Term, hs.Commit = max(hs.Term, s.Term), s.Index
		if err := c.slog.SetHardState(hs); err != nil {
			return fmt.Errorf("controller: %w", err)
		}
		if err := c.slog.SyncHardState(); err != nil {
			return fmt.Errorf("controller: %w", err)
		}
	}
	c.useSnap(s, data)
	return nil
}

// useSnap makes s the controller's state.
func (c *Controller) useSnap(s snap, data []byte) {
	t := s.Table
	t.plansSeq = c.table.plansSeq
	c.table = &t
	c.applied, c.cs = s.Index, s.Conf
	c.snap, c.snapData = s, data
}

// raftSnapshot is the snapshot raft sends a follower the log no longer
// serves: the state as applied now, so that its configuration holds every
// member added since the last snapshot (raft drops a snapshot whose
// configuration lacks its receiver). raft calls it on the controller's
// goroutine.
func (c *Controller) raftSnapshot() (*raftpb.Snapshot, error) {
	term, err := c.rs.Term(c.applied)
	if err != nil {
		return nil, err
	}
	s := snap{Index: c.applied, Term: term, Conf: cloneConf(c.cs), Table: *c.table.clone()}
	data, err := encodeSnap(s)
	if err != nil {
		return nil, err
	}
	return &raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: s.Index, Term: s.Term, ConfState: s.Conf}}, nil
}

// maybeSnapshot writes a snapshot once SnapshotEvery entries were applied
// since the last, then lets the log drop the segments it covers. The file
// is durable before the configuration is stored and before any segment
// goes.
func (c *Controller) maybeSnapshot() error {
	if c.applied < c.snap.Index+uint64(c.cfg.SnapshotEvery) {
		return nil
	}
	term, err := c.rs.Term(c.applied)
	if err != nil {
		return fmt.Errorf("controller: snapshot term: %w", err)
	}
	s := snap{Index: c.applied, Term: term, Conf: cloneConf(c.cs), Table: *c.table.clone()}
	data, err := encodeSnap(s)
	if err != nil {
		return err
	}
	if err := vfs.WriteFileAtomic(c.cfg.FS, filepath.Join(c.cfg.Dir, snapshotFile), data); err != nil {
		return fmt.Errorf("controller: write snapshot: %w", err)
	}
	if err := c.slog.SetConfState(&s.Conf); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	c.useSnap(s, data)
	if err := c.rs.Compact(s.Index); err != nil {
		return fmt.Errorf("controller: compact: %w", err)
	}
	return nil
}

// installSnap takes a snapshot the leader sent: the file first, then the
// log reset to continue after it (with its configuration).
func (c *Controller) installSnap(rs *raftpb.Snapshot) error {
	if len(rs.Data) > snapshotBytesMax {
		return fmt.Errorf("%w: %d bytes", ErrDamaged, len(rs.Data))
	}
	s, err := decodeSnap(rs.Data)
	if err != nil {
		return err
	}
	if s.Index != rs.Metadata.Index || s.Term != rs.Metadata.Term {
		return fmt.Errorf("%w: data at %d/%d, metadata at %d/%d", ErrDamaged, s.Index, s.Term, rs.Metadata.Index, rs.Metadata.Term)
	}
	s.Conf = cloneConf(rs.Metadata.ConfState)
	data, err := encodeSnap(s)
	if err != nil {
		return err
	}
	if err := vfs.WriteFileAtomic(c.cfg.FS, filepath.Join(c.cfg.Dir, snapshotFile), data); err != nil {
		return fmt.Errorf("controller: write snapshot: %w", err)
	}
	if err := c.rs.ApplySnapshot(rs); err != nil {
		return fmt.Errorf("controller: apply snapshot: %w", err)
	}
	c.useSnap(s, data)
	c.table.plansSeq++ // the plans may have changed: CohortsChanged's waiters look again
	return nil
}

func cloneConf(cs raftpb.ConfState) raftpb.ConfState {
	return raftpb.ConfState{Voters: slices.Clone(cs.Voters), Learners: slices.Clone(cs.Learners),
		VotersOutgoing: slices.Clone(cs.VotersOutgoing), LearnersNext: slices.Clone(cs.LearnersNext), AutoLeave: cs.AutoLeave}
}

func confEqual(a, b raftpb.ConfState) bool {
	return slices.Equal(a.Voters, b.Voters) && slices.Equal(a.Learners, b.Learners) &&
		slices.Equal(a.VotersOutgoing, b.VotersOutgoing) && slices.Equal(a.LearnersNext, b.LearnersNext) && a.AutoLeave == b.AutoLeave
}
