package partition

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"path/filepath"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/dedup"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/internal/wal"
)

// Checkpoint file layout (Dir/checkpoint), version 2. It is written to
// Dir/checkpoint.tmp, synced, renamed over Dir/checkpoint and the directory
// synced, so a crash leaves either the old or the new checkpoint, whole.
//
//	+--------+-----+----------+-----------+================+------------+================+----------+
//	| "SNWC" | ver | covers   | snapBytes | queue snapshot | dedupBytes | dedup snapshot | crc32c   |
//	| 4 B    | u8  | u64 LE   | u32 LE    | snapBytes      | u32 LE     | dedupBytes     | u32 LE   |
//	+--------+-----+----------+-----------+================+------------+================+----------+
//	crc32c (Castagnoli) covers every byte before it.
//
// covers is the queue's NextLSN when the snapshot was taken: both snapshots
// reflect every log record with LSN < covers, so recovery restores them and
// replays the log from covers on. The dedup snapshot (internal/dedup) keeps
// the producer sequences remembered even after retention dropped the
// segments of their Enqueue records.
//
// Version 1 had no dedup section; it is still read, with an empty window
// (the brokers that wrote it never stored producer ids).
const (
	ckptMagic      = "SNWC"
	ckptVersion    = 2
	ckptHeaderSize = 4 + 1 + 8 + 4
	// ckptBytesMax bounds the checkpoint recovery will read: a damaged
	// length field must not make it allocate without limit.
	ckptBytesMax = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeCheckpoint frames a queue snapshot and a dedup snapshot.
func encodeCheckpoint(covers uint64, snap, dd []byte) []byte {
	b := make([]byte, 0, ckptHeaderSize+len(snap)+4+len(dd)+4)
	b = append(b, ckptMagic...)
	b = append(b, ckptVersion)
	b = binary.LittleEndian.AppendUint64(b, covers)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(snap)))
	b = append(b, snap...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(dd)))
	b = append(b, dd...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeCheckpoint checks the frame and returns the LSN it covers, the
// queue snapshot and the dedup snapshot (nil in version 1), which alias b.
func decodeCheckpoint(b []byte) (uint64, []byte, []byte, error) {
	if len(b) < ckptHeaderSize+4 || string(b[:4]) != ckptMagic {
		return 0, nil, nil, errors.New("not a checkpoint file")
	}
	ver := b[4]
	if ver < 1 || ver > ckptVersion {
		return 0, nil, nil, fmt.Errorf("checkpoint version %d, want 1 to %d", ver, ckptVersion)
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return 0, nil, nil, errors.New("checkpoint checksum mismatch")
	}
	covers := binary.LittleEndian.Uint64(b[5:])
	n := uint64(binary.LittleEndian.Uint32(b[13:]))
	rest := uint64(len(body) - ckptHeaderSize)
	if n > rest {
		return 0, nil, nil, fmt.Errorf("checkpoint is %d bytes, header says its snapshot is %d", len(b), n)
	}
	snap, tail := body[ckptHeaderSize:ckptHeaderSize+n], body[ckptHeaderSize+n:]
	if ver == 1 {
		if len(tail) != 0 {
			return 0, nil, nil, fmt.Errorf("checkpoint has %d bytes after its snapshot", len(tail))
		}
		return covers, snap, nil, nil
	}
	if len(tail) < 4 || uint64(binary.LittleEndian.Uint32(tail)) != uint64(len(tail)-4) {
		return 0, nil, nil, fmt.Errorf("checkpoint's dedup section does not fill its %d bytes", len(tail))
	}
	return covers, snap, tail[4:], nil
}

// readFile returns the whole file, or (nil, nil) if it does not exist.
func readFile(fsys vfs.FS, name string) ([]byte, error) {
	return readFileMax(fsys, name, ckptBytesMax)
}

// readFileMax is readFile for a file of at most max bytes.
func readFileMax(fsys vfs.FS, name string, max int) ([]byte, error) {
	b, err := vfs.ReadFileMax(fsys, name, max)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// WriteFileAtomic replaces name with data durably; see vfs.WriteFileAtomic.
func WriteFileAtomic(fsys vfs.FS, name string, data []byte) error {
	return vfs.WriteFileAtomic(fsys, name, data)
}

// ckptJob is one checkpoint taken on the actor goroutine and written by
// the checkpointer goroutine (or by Close once the actor has stopped).
type ckptJob struct {
	covers  uint64 // the queue's NextLSN when the snapshots were taken
	data    []byte // the framed checkpoint (encodeCheckpoint)
	acked   []byte // the ACK memory (ackMemory.encode), written first
	floor   uint64 // retentionFloor(covers) at that moment
	records int    // sinceCkpt at that moment: what a success accounts for
}

// ckptResult is the checkpointer's answer for one job.
type ckptResult struct {
	job ckptJob
	err error
}

// takeCheckpoint snapshots what a checkpoint needs on the actor goroutine:
// the queue and dedup snapshots (in-memory encodings of the live state, no
// I/O) and the retention floor. ok is false when the last checkpoint
// already covers everything. Actor only, or Close once the actor stopped.
func (p *Partition) takeCheckpoint() (ckptJob, bool) {
	covers := p.st.NextLSN()
	if covers == p.ckptLSN && p.sinceCkpt == 0 {
		return ckptJob{}, false
	}
	if !p.single && covers > p.committed+1 {
		// A leader's state holds entries a quorum may not have yet; a
		// checkpoint claiming them could outlive their replacement by
		// another leader. It waits for a moment with nothing pending.
		return ckptJob{}, false
	}
	return ckptJob{
		covers: covers,
		data:   encodeCheckpoint(covers, p.st.Snapshot(nil), p.dd.Snapshot(nil)),
		acked:  p.acked.encode(),
		// raft still hands out entries above the last one it reported
		// committed: none of those may be dropped.
		floor:   min(p.retentionFloor(covers), p.committed+1),
		records: p.sinceCkpt,
	}, true
}

// writeCheckpoint makes the log durable through j.covers, writes j's
// checkpoint atomically and then drops the log segments that neither
// recovery (below the checkpoint) nor delivery (below every live message's
// body when j was taken, see relocate.go) can need. It touches only the log
// (safe from any goroutine) and the file system, so it runs on the
// checkpointer goroutine while the actor goes on. A floor taken at j stays
// safe later: bodies only move forward (relocation) and later messages get
// LSNs at or above j.covers.
func (p *Partition) writeCheckpoint(j ckptJob) error {
	// Everything the snapshot reflects must be durable before the
	// checkpoint claims it; under SyncAlways it mostly is already, under
	// SyncInterval this forces it. The WAL mark is taken first: the
	// actor may overwrite a replica's suffix while this syncs.
	var mark uint64
	if p.cfg.WAL != nil {
		mark = p.cfg.WAL.Mark(p.cfg.WALGroup)
	}
	lsn, err := p.log.Sync()
	if err != nil {
		return fmt.Errorf("checkpoint: sync log: %w", err)
	}
	if j.covers > 0 && lsn < j.covers-1 {
		// The snapshot reflects records the log does not hold. The actor
		// appends before it applies, so this is a broken invariant; it is
		// refused rather than written.
		return fmt.Errorf("checkpoint: covers lsn %d but the log is durable only to %d", j.covers, lsn)
	}
	if p.cfg.WAL != nil {
		// The log's own files now hold what the WAL held for it.
		p.cfg.WAL.ReleaseSince(p.cfg.WALGroup, lsn, mark)
	}
	// The ACK memory first: recovery replays the ACKs after the
	// checkpoint on top of it, so it must hold every one before.
	if err := WriteFileAtomic(p.cfg.FS, p.ackPath(), j.acked); err != nil {
		return fmt.Errorf("checkpoint: ACK memory: %w", err)
	}
	if err := WriteFileAtomic(p.cfg.FS, p.ckptPath(), j.data); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if p.cfg.noRetention {
		return nil
	}
	if segs := p.log.Segments(); j.floor == j.covers && j.covers == p.log.NextLSN() &&
		segs[len(segs)-1].Bytes >= rotateBytesMin {
		// Nothing in the log is needed any more, the active segment
		// included: start an empty one so that this one can go too.
		if err := p.log.Rotate(); err != nil {
			return fmt.Errorf("checkpoint: rotate: %w", err)
		}
	}
	if _, err := p.log.DropBefore(j.floor); err != nil {
		return fmt.Errorf("checkpoint: retention: %w", err)
	}
	return nil
}

// checkpoint takes and writes a checkpoint on the calling goroutine. Only
// Close uses it, once the actor has stopped and no checkpoint is under way.
func (p *Partition) checkpoint() error {
	j, ok := p.takeCheckpoint()
	if !ok {
		return nil
	}
	if err := p.writeCheckpoint(j); err != nil {
		return err
	}
	p.checkpointWritten(j)
	return nil
}

// checkpointWritten notes that j is the checkpoint on disk now: the
// records appended since j was taken still count towards the next one.
func (p *Partition) checkpointWritten(j ckptJob) {
	p.ckptLSN = j.covers
	p.sinceCkpt = max(p.sinceCkpt-j.records, 0)
}

// startCheckpoint writes checkpoint j on a goroutine of its own, so that
// the file write, its fsyncs and the segment deletions of retention never
// run on the actor goroutine; one at a time (ckptBusy). The goroutine owns
// nothing: the job carries its bytes, and the answer goes back to the actor
// (ckptDone). It lives for one checkpoint: an idle partition keeps no
// goroutine for them.
func (p *Partition) startCheckpoint(j ckptJob) {
	p.ckptBusy = true
	go func() {
		p.ckptDone <- ckptResult{job: j, err: p.writeCheckpoint(j)}
	}()
}

// loadCheckpoint reads the checkpoint (if any) into a fresh queue state
// and dedup table, and the ACK memory written with it into p.acked; covers
// is the LSN it covers (0: no checkpoint).
func (p *Partition) loadCheckpoint() (st *queue.State, dd *dedup.Table, covers uint64, found bool, err error) {
	cfg := &p.cfg
	raw, err := readFile(cfg.FS, p.ckptPath())
	if err != nil {
		return nil, nil, 0, false, fmt.Errorf("partition %s: read checkpoint: %w", p, err)
	}
	st = queue.New(cfg.Queue)
	dd = dedup.New(cfg.Dedup)
	p.acked = newAckMemory()
	if raw == nil {
		return st, dd, 0, false, nil
	}
	c, snap, ddSnap, err := decodeCheckpoint(raw)
	if err != nil {
		return nil, nil, 0, true, p.damaged("checkpoint: %w", err)
	}
	st, err = queue.Restore(cfg.Queue, snap)
	if err != nil {
		return nil, nil, 0, true, p.damaged("checkpoint: %w", err)
	}
	if ddSnap != nil {
		if dd, err = dedup.Restore(cfg.Dedup, ddSnap); err != nil {
			return nil, nil, 0, true, p.damaged("checkpoint: %w", err)
		}
	}
	if st.NextLSN() != c {
		return nil, nil, 0, true, p.damaged("checkpoint covers lsn %d but its snapshot ends at %d", c, st.NextLSN())
	}
	p.acked = p.loadAckMemory()
	return st, dd, c, true, nil
}

func (p *Partition) damaged(format string, args ...any) error {
	return fmt.Errorf("%w: partition %s: %w", ErrDamaged, p, fmt.Errorf(format, args...))
}

// replayRecord applies one log record to st and what the partition keeps
// beside it (the ACK memory, dd). A record that is not a queue event (a raft
// leader's empty entry, a configuration change) is a settled gap.
func (p *Partition) replayRecord(st *queue.State, dd *dedup.Table, r seglog.Record) error {
	if !queue.IsEventType(r.Type) {
		return st.ApplyGap(r.LSN)
	}
	ev, err := queue.DecodeEvent(r.Type, r.Payload)
	if err != nil {
		return fmt.Errorf("lsn %d: %w", r.LSN, err)
	}
	if err := st.Apply(r.LSN, ev); err != nil {
		return err
	}
	if ev.Kind == queue.KindAck {
		p.acked.put(ev.Offset, ev.LeaseID)
	}
	if ev.Kind == queue.KindEnqueue {
		// Only a committed record is replayed, so only a committed
		// store is remembered as seen.
		dd.Record(ev.Msg.ProducerID, ev.Msg.ProducerSeq, r.LSN, ev.Msg.PublishedAtMs)
	}
	return nil
}

// singleReplica reports whether the partition's raft group is this replica
// alone.
func (p *Partition) singleReplica() bool {
	if p.cfg.Replicated {
		return false
	}
	id := max(p.cfg.RaftID, 1)
	return len(p.cfg.RaftPeers) == 0 || len(p.cfg.RaftPeers) == 1 && p.cfg.RaftPeers[0] == id
}

// recover restores the checkpoint (if any) and replays the log after it up
// to the raft commit index, then starts raft. In a group of one every
// record the log holds is committed: its only voter has it, and it is the
// only replica that could have appended it. A larger group replays to the
// commit index stored in its HardState; the entries after it wait for the
// leader to commit them or replace them.
func (p *Partition) recover() error {
	cfg := &p.cfg
	existed := false // asked only when it can spare the syncs below
	if cfg.SurvivorsDurable {
		_, err := cfg.FS.Stat(p.logPath())
		existed = err == nil
	}
	if err := cfg.FS.MkdirAll(p.logPath(), vfs.DirPerm); err != nil {
		return fmt.Errorf("partition %s: %w", p, err)
	}
	// Make the directories themselves durable: a synced log in a
	// directory whose entry was never synced is lost with it. Directories
	// an earlier process made are, once the node synced its whole file
	// system at start (SurvivorsDurable).
	if !existed {
		for _, d := range []string{cfg.Dir, filepath.Dir(cfg.Dir)} {
			if err := cfg.FS.SyncDir(d); err != nil {
				return fmt.Errorf("partition %s: %w", p, err)
			}
		}
	}
	st, dd, covers, found, err := p.loadCheckpoint()
	if err != nil {
		return err
	}
	single := p.singleReplica()
	opts := seglog.Options{
		FS:             cfg.FS,
		Dir:            p.logPath(),
		SegmentBytes:   cfg.SegmentBytes,
		Sync:           cfg.Sync,
		SyncIntervalMs: cfg.SyncIntervalMs,
		Corruption:     cfg.Corruption,
		Preallocate:    cfg.Preallocate,
		Logger:         p.logger,
		// What a crashed process left in the log is durable once the
		// node synced its file system whole.
		SurvivorsDurable: cfg.SurvivorsDurable,
	}
	if cfg.WAL != nil {
		// The journal makes entries durable; the log is the store for
		// reads, written in large batches off the hot path (a read of a
		// record not written yet writes it first) and fsynced only at
		// checkpoints and under journal pressure (which then release the
		// journal) and at Close.
		opts.Sync, opts.SyncIntervalMs, opts.BufferBytes = seglog.SyncManual, storeWriteIntervalMs, storeBufferBytes
	}
	if single {
		// Everything is committed: replay during Open's verification
		// scan, which reads each record once.
		opts.ReplayFrom = covers
		opts.Replay = func(r seglog.Record) error { return p.replayRecord(st, dd, r) }
	}
	log, err := seglog.Open(opts)
	if err != nil {
		var ce *seglog.CorruptionError
		if errors.As(err, &ce) || errors.Is(err, queue.ErrCorrupt) {
			return p.damaged("%w", err)
		}
		return fmt.Errorf("partition %s: open log: %w", p, err)
	}
	if pending, err := p.finishPendingSnapshot(log); err != nil {
		log.Close()
		return err
	} else if pending {
		// The state comes from the snapshot's checkpoint, not from the
		// one the log was replayed against.
		if st, dd, covers, found, err = p.loadCheckpoint(); err != nil {
			log.Close()
			return err
		}
		if single && covers < log.NextLSN() {
			err := log.ScanRange(covers, log.NextLSN()-1, func(r seglog.Record) error { return p.replayRecord(st, dd, r) })
			if err != nil {
				log.Close()
				return p.damaged("replay after a raft snapshot: %w", err)
			}
		}
	}
	if err := p.mergeWAL(log, single, st, dd, covers); err != nil {
		log.Close()
		return err
	}
	first, next := log.FirstLSN(), log.NextLSN()
	switch {
	case !found && first > 1:
		err = p.damaged("no checkpoint, and the log starts at lsn %d", first)
	case found && first > max(covers, 1):
		err = p.damaged("checkpoint covers lsn %d, but the log starts at %d", covers, first)
	case found && next < covers:
		err = p.damaged("checkpoint covers lsn %d, but the log ends before %d", covers, next)
	}
	if err != nil {
		log.Close()
		return err
	}
	if rep := log.Report(); rep.Corruption != nil || rep.TornBytes > 0 {
		p.logger.Warn("partition log repaired at open", "torn_bytes", rep.TornBytes,
			"corruption", rep.Corruption, "dropped_segments", rep.DroppedSegments)
	}
	commit := next - 1
	if !single {
		commit = log.HardState().Commit
		if commit > next-1 {
			if log.Report().Corruption == nil {
				log.Close()
				return p.damaged("raft commit index %d is past the end of the log (%d)", commit, next-1)
			}
			p.logger.Warn("log truncated below the raft commit index", "commit", commit, "last", next-1)
			commit = next - 1
		}
		commit = max(commit, covers-min(covers, 1))
		if covers < commit+1 {
			err := log.ScanRange(max(covers, first), commit, func(r seglog.Record) error { return p.replayRecord(st, dd, r) })
			if err != nil {
				log.Close()
				return p.damaged("replay to the commit index: %w", err)
			}
		}
	}
	st.SetLeaseIDs(p.cfg.LeaseIDs)
	p.log, p.st, p.dd, p.ckptLSN = log, st, dd, covers
	// The records after the checkpoint count toward the next one: a
	// partition that keeps crashing before CheckpointEveryRecords new
	// records would otherwise replay an ever longer log at each open.
	if from := max(covers, first); next > from {
		p.sinceCkpt = int(min(next-from, math.MaxInt32))
	}
	if err := p.startRaft(commit); err != nil {
		log.Close()
		return err
	}
	if single {
		for _, in := range st.PendingDeadLetters() {
			p.deadLetters[in.Offset] = &deadLetter{}
		}
		p.recovered = st.Leases()
	}
	return nil
}

// ReleaseWAL syncs the partition's own log and releases the node WAL (see
// Config.WAL) up to what it synced. Safe from any goroutine; the broker
// calls it when the WAL asks (wal.Options.OnPressure).
func (p *Partition) ReleaseWAL() error {
	if p.cfg.WAL == nil || p.log == nil {
		return nil
	}
	mark := p.cfg.WAL.Mark(p.cfg.WALGroup)
	lsn, err := p.log.Sync()
	if err != nil {
		return fmt.Errorf("partition %s: release wal: %w", p, err)
	}
	p.cfg.WAL.ReleaseSince(p.cfg.WALGroup, lsn, mark)
	return nil
}

// With the node journal, a partition's log buffers up to storeBufferBytes
// of records and writes them to the OS at least every storeWriteIntervalMs
// (no fsync: the journal made them durable).
const (
	storeWriteIntervalMs = 1000
	storeBufferBytes     = 256 << 10
)

// mergeWAL copies into log the entries the node journal replayed for this
// partition and the log lacks (written to the OS but not fsynced before a
// crash, or never written), syncs the log and releases the journal for
// them. A group of one replays them into the state as well, since its log
// replay during Open has run already.
//
// The journal's run for a group is the last write of every index it holds:
// its segments go oldest first, replay lets a later write of an index
// replace the earlier one, and a snapshot voids what came before it
// (wal.Batch.Reset). So where the log and the journal disagree the journal
// wins, and the log's suffix from there is replaced (a follower overwritten
// by a new leader, with the log's copy older, whatever the terms). Past the
// journal's last entry the log may hold more, written to the OS after the
// journal's last fsync; what it holds there of a lower term than the
// journal's last entry is an overwritten suffix whose truncation did not
// reach the disk, and is dropped. A group of one has no other leader, so a
// differing term there is damage, as is a journal entry past a gap.
func (p *Partition) mergeWAL(log *seglog.Log, single bool, st *queue.State, dd *dedup.Table, covers uint64) error {
	g := p.cfg.WALReplay
	if p.cfg.WAL == nil || g == nil {
		return nil
	}
	if len(g.Entries) == 0 {
		return p.mergeWALHardState(log, g)
	}
	var last, lastTerm uint64
	for _, e := range g.Entries {
		last, lastTerm = e.Index, e.Term
		if e.Index < log.FirstLSN() || !single && e.Index < covers {
			// Below covers every entry is committed, in the checkpoint
			// and synced in the log before it was written.
			continue
		}
		next := log.NextLSN()
		if e.Index < next {
			t, err := log.Term(e.Index)
			if err != nil {
				return fmt.Errorf("partition %s: journal merge: %w", p, err)
			}
			if t == e.Term {
				continue
			}
			if single {
				return p.damaged("journal entry %d has term %d, the log has term %d", e.Index, e.Term, t)
			}
			// The journal holds the later write: it replaces the log's
			// suffix from here (AppendAt truncates it).
		} else if e.Index > next {
			return p.damaged("journal entry %d is past the end of the log (%d)", e.Index, next-1)
		}
		if err := log.AppendAt(e.Index, e.Term, e.Type, e.Payload); err != nil {
			return fmt.Errorf("partition %s: journal merge: %w", p, err)
		}
		if single && e.Index >= covers {
			r := seglog.Record{LSN: e.Index, Term: e.Term, Type: e.Type, Payload: e.Payload}
			if err := p.replayRecord(st, dd, r); err != nil {
				return p.damaged("journal replay: %w", err)
			}
		}
	}
	if !single && log.NextLSN() > last+1 {
		if t, err := log.Term(last + 1); err == nil && t < lastTerm {
			if err := log.TruncateAfter(last); err != nil {
				return fmt.Errorf("partition %s: journal merge: %w", p, err)
			}
		}
	}
	if _, err := log.Sync(); err != nil {
		return fmt.Errorf("partition %s: journal merge: sync: %w", p, err)
	}
	if err := p.mergeWALHardState(log, g); err != nil {
		return err
	}
	p.cfg.WAL.Release(p.cfg.WALGroup, last)
	return nil
}

// mergeWALHardState stores the HardState the journal replayed for this
// group in the log's own file when it is newer there (a term or vote
// change is committed through the journal and written to the file without
// an fsync; see storeHardState). Its commit index is bounded by the merged
// log's end and never lowered.
func (p *Partition) mergeWALHardState(log *seglog.Log, g *wal.Group) error {
	if !g.HasHardState {
		return nil
	}
	cur, j := log.HardState(), g.HardState
	if j.Term < cur.Term || j.Term == cur.Term && (cur.Vote != 0 || j.Vote == 0) {
		return nil
	}
	commit := max(cur.Commit, min(j.Commit, log.NextLSN()-1))
	if err := log.SetHardState(&raftpb.HardState{Term: j.Term, Vote: j.Vote, Commit: commit}); err != nil {
		return fmt.Errorf("partition %s: journal merge: hard state: %w", p, err)
	}
	return nil
}

// rebuild replaces the queue state with the committed one: the checkpoint
// plus the log replayed up to commit. A leader that stops leading uses it to
// drop what it decided and did not see committed.
func (p *Partition) rebuild(commit uint64) error {
	st, dd, covers, _, err := p.loadCheckpoint()
	if err != nil {
		return err
	}
	// Without a checkpoint the log must start at its beginning; with one,
	// no later than what it covers.
	if covers < commit+1 && max(covers, 1) < p.log.FirstLSN() {
		return fmt.Errorf("%w: partition %s: rebuild: the checkpoint covers up to %d but the log starts at %d", ErrDamaged, p, covers, p.log.FirstLSN())
	}
	if covers < commit+1 {
		err := p.log.ScanRange(max(covers, p.log.FirstLSN()), commit, func(r seglog.Record) error { return p.replayRecord(st, dd, r) })
		if err != nil {
			return fmt.Errorf("partition %s: rebuild to the commit index %d: %w", p, commit, err)
		}
	}
	st.SetLeaseIDs(p.cfg.LeaseIDs)
	p.st, p.dd = st, dd
	// Cached bodies may belong to entries past commit, which another
	// leader may have replaced.
	p.cache.reset()
	clear(p.loaded)
	return nil
}

// checkpointDue reports whether CheckpointEveryRecords records were
// appended since the last checkpoint, or some were and the partition has
// been idle for idleCheckpointMs.
func (p *Partition) checkpointDue(now int64) bool {
	return p.sinceCkpt >= p.cfg.CheckpointEveryRecords ||
		p.sinceCkpt > 0 && now-p.lastBusyMs >= idleCheckpointMs
}

// periodicCheckpoint relocates the live bodies of sparse old segments,
// takes a checkpoint and hands it to the checkpointer goroutine, which
// writes it while the actor goes on (at most one is under way).
func (p *Partition) periodicCheckpoint() {
	if p.leads && !p.single {
		p.replicatedCheckpoint()
		return
	}
	if !p.leads {
		// Only the leader decides records; a follower's checkpoints
		// follow what it applied.
	} else if _, err := p.relocate(); err != nil {
		p.fail(err, nil)
		return
	}
	if err := p.flushHardState(); err != nil {
		p.fail(err, nil)
		return
	}
	j, ok := p.takeCheckpoint()
	if !ok {
		return
	}
	p.startCheckpoint(j)
}

// replicatedCheckpoint is periodicCheckpoint on the leader of a larger
// group. Its checkpoint may claim only committed entries, and under load
// the leader always has some that are not: so once a checkpoint is due the
// actor takes no new command (ckptHold; see run) until the quorum has
// caught up, which takes one replication round, and then checkpoints.
// Relocation follows the checkpoint (its records are the next one's), so
// that its own appends do not keep the checkpoint waiting.
func (p *Partition) replicatedCheckpoint() {
	if err := p.flushHardState(); err != nil {
		p.fail(err, nil)
		return
	}
	j, ok := p.takeCheckpoint()
	if !ok {
		p.ckptHold = p.st.NextLSN() > p.committed+1
		return
	}
	p.ckptHold = false
	p.startCheckpoint(j)
	if _, err := p.relocate(); err != nil {
		p.fail(err, nil)
	}
}

// checkpointed handles the checkpointer's answer. A failure backs off: the
// wait doubles with each consecutive failure from checkpointRetryMinMs up
// to checkpointRetryMaxMs. Each failure is counted
// (Stats.CheckpointFailures) and logged once, with the wait before the next
// attempt.
func (p *Partition) checkpointed(res ckptResult) {
	p.ckptBusy = false
	if res.err == nil {
		p.checkpointWritten(res.job)
		if p.ckptStreak > 0 {
			p.logger.Info("checkpoint succeeded after failures", "failures", p.ckptStreak)
		}
		p.ckptStreak, p.ckptRetryAtMs = 0, 0
		return
	}
	p.ckptFailures++
	p.ckptStreak++
	wait := int64(checkpointRetryMaxMs)
	if p.ckptStreak <= 20 { // beyond that the shift would pass the cap anyway
		wait = min(int64(checkpointRetryMinMs)<<(p.ckptStreak-1), checkpointRetryMaxMs)
	}
	p.ckptRetryAtMs = p.nowMs() + wait
	p.logger.Error("checkpoint failed; retrying after a backoff", "err", res.err,
		"consecutive_failures", p.ckptStreak, "retry_in_ms", wait)
}
