package partition

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"path/filepath"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/internal/wal"
)

// Raft snapshots. A replica that lags behind what its leader's log still
// holds is caught up with a snapshot: the leader's last checkpoint (queue
// state and dedup window, covering every index below covers) plus the log
// records from the checkpoint's body floor to covers-1, which hold the
// bodies of the messages still live in that state. Retention never drops
// those (its floor is at or below the body floor when the checkpoint was
// taken), so the leader reads them from its own log. The receiving replica
// writes the checkpoint as its own, restarts its log at the body floor with
// those records (committed entries, identical to the leader's), and
// continues after the snapshot's index, covers-1.
//
// Encoding (little endian):
//
//	"SNSP" | version u8 | floor u64 | term of floor-1 u64 | checkpoint length u32 | checkpoint
//	| records u32 | { index u64 | term u64 | type u8 | length u32 | payload } ... | crc32c u32
//
// The checksum covers everything before it.
const (
	snapMagic   = "SNSP"
	snapVersion = 1
	// raftSnapshotBytesMax bounds a snapshot. A leader whose snapshot
	// would be larger reports it unavailable (raft retries later); its
	// relocation pass keeps moving the live bodies of old segments
	// forward, which shrinks the next one.
	raftSnapshotBytesMax = 256 << 20
)

// RaftSnapshotBytesMax bounds the snapshot a replicated partition sends a
// replica that is too far behind for its log: the peer transport's frame
// must be larger, or the snapshot never arrives (raftnet drops a message
// larger than a frame).
const RaftSnapshotBytesMax = raftSnapshotBytesMax

var snapCRC = crc32.MakeTable(crc32.Castagnoli)

// snapRecord is one log record a snapshot carries.
type snapRecord struct {
	index, term uint64
	typ         uint8
	payload     []byte
}

// snapBuild is a snapshot being built, or built and not yet handed to
// raft, off the actor goroutine (see makeSnapshot).
type snapBuild struct {
	term    uint64 // the leader's term when the build started
	startMs int64
	done    chan struct{}
	snap    *raftpb.Snapshot // set before done closes
	err     error
}

// snapshotKeepMs bounds how long a built snapshot that raft has not asked
// for again is kept (it may be up to raftSnapshotBytesMax).
const snapshotKeepMs = 30_000

// makeSnapshot is raft's snapshot source, called on the actor goroutine
// when a follower needs entries the log no longer holds. Reading a
// checkpoint and up to raftSnapshotBytesMax of log there would stop the
// partition (and its turns' replies) for as long as the disk takes, so the
// first call starts a build on a goroutine of its own and answers
// ErrSnapshotTemporarilyUnavailable; raft asks again at its next attempt
// to reach that follower (a heartbeat's answer), and gets the snapshot once
// it is built. A build made under an earlier term, or kept past
// snapshotKeepMs, is dropped.
func (p *Partition) makeSnapshot() (*raftpb.Snapshot, error) {
	term := p.term.Load()
	if b := p.snap; b != nil {
		select {
		case <-b.done:
			p.snap = nil
			if b.err == nil && b.term == term && p.nowMs()-b.startMs < snapshotKeepMs {
				return b.snap, nil
			}
		default:
			return nil, raft.ErrSnapshotTemporarilyUnavailable
		}
	}
	cs, err := p.log.ConfState()
	if err != nil {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	b := &snapBuild{term: term, startMs: p.nowMs(), done: make(chan struct{})}
	p.snap = b
	go func() {
		defer close(b.done)
		b.snap, b.err = p.buildSnapshot(cs)
		p.Poke()
	}()
	return nil, raft.ErrSnapshotTemporarilyUnavailable
}

// expireSnapshot drops a built snapshot that raft can no longer use (made
// under another term) or has not asked for within snapshotKeepMs, so its
// memory goes. Called after every turn; the build's end pokes for one.
func (p *Partition) expireSnapshot() {
	b := p.snap
	if b == nil {
		return
	}
	select {
	case <-b.done:
		if b.err != nil || b.term != p.term.Load() || p.nowMs()-b.startMs >= snapshotKeepMs {
			p.snap = nil
		}
	default:
	}
}

// snapshotAnswerWaitMs is how long a leader keeps a follower waiting for
// a snapshot it sent before raft hears it finished anyway. raft sends the
// follower nothing else meanwhile: appends sent at once would overtake the
// snapshot (it travels on a lane of its own, raftnet) and be refused, and
// the leader would build and send another. The follower's answer once it
// has applied the snapshot ends the wait first, in the common case; the
// bound covers an answer that never comes (the follower restarted after
// applying it): raft then probes the follower, which asks for a snapshot
// again only if it still lacks one.
const snapshotAnswerWaitMs = 2_000

// snapshotLost reports the snapshot sent to follower to as failed, so raft
// probes the follower again and sends a new one if it still needs one.
func (p *Partition) snapshotLost(to uint64, why string) {
	if _, ok := p.snapsSent[to]; !ok {
		return
	}
	delete(p.snapsSent, to)
	p.rn.ReportSnapshot(to, raft.SnapshotFailure)
	p.logger.Info("raft snapshot to a follower lost; it is sent again if still needed", "to", to, "why", why)
}

// checkSnapshotsSent forgets the snapshots whose followers answered (raft
// no longer waits on them) and reports as finished those unanswered for
// snapshotAnswerWaitMs. Actor only, after each turn.
func (p *Partition) checkSnapshotsSent(now int64) {
	if len(p.snapsSent) == 0 {
		return
	}
	waiting := map[uint64]bool{}
	p.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if pr.State == tracker.StateSnapshot {
			waiting[id] = true
		}
	})
	for to, at := range p.snapsSent {
		switch {
		case !waiting[to]:
			delete(p.snapsSent, to)
		case now-at >= snapshotAnswerWaitMs:
			delete(p.snapsSent, to)
			p.rn.ReportSnapshot(to, raft.SnapshotFinish)
		}
	}
}

// awaitSnapshotBuild waits for a snapshot build under way and drops it
// (Close: the log it reads is about to close).
func (p *Partition) awaitSnapshotBuild() {
	if b := p.snap; b != nil {
		<-b.done
		p.snap = nil
	}
}

// buildSnapshot builds a snapshot from the last checkpoint on disk and the
// log records holding its live bodies, with cs as its membership. It runs
// on its own goroutine: it reads only the checkpoint file and the log,
// whose reads are safe beside the actor's appends.
func (p *Partition) buildSnapshot(cs *raftpb.ConfState) (*raftpb.Snapshot, error) {
	raw, err := readFile(p.cfg.FS, p.ckptPath())
	if err != nil || raw == nil {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	covers, snap, _, err := decodeCheckpoint(raw)
	if err != nil || covers == 0 {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	st, err := queue.Restore(p.cfg.Queue, snap)
	if err != nil {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	floor := max(min(covers, st.BodyFloor()), 1)
	index := covers - 1
	term, err := p.log.Term(index)
	if err != nil {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	var prevTerm uint64
	if floor > 1 {
		if prevTerm, err = p.log.Term(floor - 1); err != nil {
			return nil, raft.ErrSnapshotTemporarilyUnavailable
		}
	}
	b := append([]byte(snapMagic), snapVersion)
	b = binary.LittleEndian.AppendUint64(b, floor)
	b = binary.LittleEndian.AppendUint64(b, prevTerm)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(raw)))
	b = append(b, raw...)
	countAt := len(b)
	b = binary.LittleEndian.AppendUint32(b, 0)
	n := 0
	if floor < covers {
		err = p.log.ScanRange(floor, index, func(r seglog.Record) error {
			if len(b) > raftSnapshotBytesMax {
				return errSnapshotTooLarge
			}
			b = binary.LittleEndian.AppendUint64(b, r.LSN)
			b = binary.LittleEndian.AppendUint64(b, r.Term)
			b = append(b, r.Type)
			b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Payload)))
			b = append(b, r.Payload...)
			n++
			return nil
		})
		if err != nil {
			p.logger.Warn("raft snapshot unavailable", "index", index, "floor", floor, "err", err)
			return nil, raft.ErrSnapshotTemporarilyUnavailable
		}
	}
	binary.LittleEndian.PutUint32(b[countAt:], uint32(n))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, snapCRC))
	return &raftpb.Snapshot{Data: b, Metadata: raftpb.SnapshotMetadata{Index: index, Term: term, ConfState: *cs}}, nil
}

var errSnapshotTooLarge = fmt.Errorf("snapshot larger than %d bytes", raftSnapshotBytesMax)

// decodeSnapshot checks and splits a snapshot's data.
func decodeSnapshot(b []byte) (floor, prevTerm uint64, ckpt []byte, recs []snapRecord, err error) {
	bad := func(why string) error { return fmt.Errorf("%w: raft snapshot: %s", ErrDamaged, why) }
	if len(b) < len(snapMagic)+1+8+8+4+4+4 || string(b[:4]) != snapMagic {
		return 0, 0, nil, nil, bad("not a snapshot")
	}
	if b[4] != snapVersion {
		return 0, 0, nil, nil, bad(fmt.Sprintf("version %d", b[4]))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, snapCRC) != sum {
		return 0, 0, nil, nil, bad("checksum mismatch")
	}
	r := body[5:]
	floor, prevTerm = binary.LittleEndian.Uint64(r), binary.LittleEndian.Uint64(r[8:])
	n := binary.LittleEndian.Uint32(r[16:])
	r = r[20:]
	if uint64(n) > uint64(len(r)) {
		return 0, 0, nil, nil, bad("checkpoint length")
	}
	ckpt, r = r[:n], r[n:]
	if len(r) < 4 {
		return 0, 0, nil, nil, bad("short")
	}
	count := binary.LittleEndian.Uint32(r)
	r = r[4:]
	for range count {
		if len(r) < 21 {
			return 0, 0, nil, nil, bad("short record")
		}
		rec := snapRecord{index: binary.LittleEndian.Uint64(r), term: binary.LittleEndian.Uint64(r[8:]), typ: r[16]}
		l := binary.LittleEndian.Uint32(r[17:])
		r = r[21:]
		if uint64(l) > uint64(len(r)) {
			return 0, 0, nil, nil, bad("record length")
		}
		rec.payload, r = r[:l], r[l:]
		if len(recs) > 0 && rec.index != recs[len(recs)-1].index+1 || len(recs) == 0 && rec.index != floor {
			return 0, 0, nil, nil, bad("records out of order")
		}
		recs = append(recs, rec)
	}
	if len(r) != 0 {
		return 0, 0, nil, nil, bad("trailing bytes")
	}
	return floor, prevTerm, ckpt, recs, nil
}

// installSnapshot makes a snapshot from the leader this replica's durable
// state: its checkpoint is written as this replica's, and the log restarts
// at the snapshot's body floor with the records it carries, synced. The
// queue state is loaded from it by applySnapshot, right after.
func (p *Partition) installSnapshot(snap *raftpb.Snapshot) error {
	md := snap.Metadata
	if p.ckptBusy {
		// The checkpointer must not write an older checkpoint after
		// this one.
		p.checkpointed(<-p.ckptDone)
	}
	covers, floor, nrec, err := p.storeSnapshot(p.log, snap)
	if err != nil {
		return err
	}
	if p.cfg.WAL != nil {
		p.cfg.WAL.Release(p.cfg.WALGroup, p.log.NextLSN()-1)
	}
	if err := p.rs.InstallSnapshot(snap); err != nil {
		return fmt.Errorf("raft snapshot: %w", err)
	}
	p.ckptLSN, p.sinceCkpt = covers, 0
	p.cache.reset()
	p.logger.Info("raft snapshot installed", "index", md.Index, "floor", floor, "records", nrec)
	return nil
}

// storeSnapshot makes snap the replica's durable state: its checkpoint, and
// a log that restarts at its floor with its records. The steps are not
// atomic, so the snapshot is first written whole to snapshotPendingFile:
// recover finds it after a crash in between and stores it again, and it is
// removed once the log is synced.
func (p *Partition) storeSnapshot(log *seglog.Log, snap *raftpb.Snapshot) (covers, floor uint64, nrec int, err error) {
	md := snap.Metadata
	floor, prevTerm, ckpt, recs, err := decodeSnapshot(snap.Data)
	if err != nil {
		return 0, 0, 0, err
	}
	covers, _, _, err = decodeCheckpoint(ckpt)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%w: raft snapshot: checkpoint: %w", ErrDamaged, err)
	}
	if covers != md.Index+1 || floor > covers {
		return 0, 0, 0, fmt.Errorf("%w: raft snapshot at %d holds a checkpoint covering %d from %d", ErrDamaged, md.Index, covers, floor)
	}
	pending, err := encodePendingSnapshot(snap)
	if err != nil {
		return 0, 0, 0, err
	}
	pendingPath := filepath.Join(p.cfg.Dir, snapshotPendingFile)
	if err := WriteFileAtomic(p.cfg.FS, pendingPath, pending); err != nil {
		return 0, 0, 0, fmt.Errorf("raft snapshot: %w", err)
	}
	p.snapshotStep("pending")
	if err := WriteFileAtomic(p.cfg.FS, p.ckptPath(), ckpt); err != nil {
		return 0, 0, 0, fmt.Errorf("raft snapshot: %w", err)
	}
	p.snapshotStep("checkpoint")
	if err := log.ResetTo(floor-1, prevTerm); err != nil {
		return 0, 0, 0, fmt.Errorf("raft snapshot: reset log: %w", err)
	}
	for _, r := range recs {
		if err := log.AppendAt(r.index, r.term, r.typ, r.payload); err != nil {
			return 0, 0, 0, fmt.Errorf("raft snapshot: append %d: %w", r.index, err)
		}
	}
	p.snapshotStep("appended")
	if _, err := log.Sync(); err != nil {
		return 0, 0, 0, fmt.Errorf("raft snapshot: sync: %w", err)
	}
	p.snapshotStep("synced")
	if p.cfg.WAL != nil {
		// The journal's earlier entries of this group belong to the log
		// the snapshot replaced: recovery must never merge them into it.
		if err := p.cfg.WAL.Commit(p.cfg.WALGroup, wal.Batch{Reset: true}); err != nil {
			return 0, 0, 0, fmt.Errorf("raft snapshot: journal: %w", err)
		}
	}
	if err := log.SetConfState(&md.ConfState); err != nil {
		return 0, 0, 0, fmt.Errorf("raft snapshot: %w", err)
	}
	p.noteConf(&md.ConfState)
	if err := p.cfg.FS.Remove(pendingPath); err != nil {
		return 0, 0, 0, fmt.Errorf("raft snapshot: %w", err)
	}
	if err := p.cfg.FS.SyncDir(p.cfg.Dir); err != nil {
		return 0, 0, 0, fmt.Errorf("raft snapshot: %w", err)
	}
	return covers, floor, len(recs), nil
}

func (p *Partition) snapshotStep(step string) {
	if p.cfg.snapshotStep != nil {
		p.cfg.snapshotStep(step)
	}
}

// snapshotPendingFile holds a raft snapshot while storeSnapshot installs it.
const snapshotPendingFile = "snapshot.pending"

// encodePendingSnapshot encodes snap for snapshotPendingFile:
//
//	"SNPD" | metadata length u32 | metadata (protobuf) | data | crc32c u32
func encodePendingSnapshot(snap *raftpb.Snapshot) ([]byte, error) {
	md, err := snap.Metadata.Marshal()
	if err != nil {
		return nil, fmt.Errorf("raft snapshot: %w", err)
	}
	b := make([]byte, 0, 8+len(md)+len(snap.Data)+4)
	b = append(b, "SNPD"...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(md)))
	b = append(b, md...)
	b = append(b, snap.Data...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

func decodePendingSnapshot(b []byte) (*raftpb.Snapshot, error) {
	if len(b) < 12 || string(b[:4]) != "SNPD" {
		return nil, errors.New("pending raft snapshot: bad header")
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, errors.New("pending raft snapshot: checksum mismatch")
	}
	n := uint64(binary.LittleEndian.Uint32(body[4:8]))
	if n > uint64(len(body)-8) {
		return nil, errors.New("pending raft snapshot: metadata past the end")
	}
	md := raftpb.SnapshotMetadata{}
	if err := md.Unmarshal(body[8 : 8+n]); err != nil {
		return nil, fmt.Errorf("pending raft snapshot: metadata: %w", err)
	}
	return &raftpb.Snapshot{Metadata: md, Data: body[8+n:]}, nil
}

// finishPendingSnapshot stores again a snapshot whose install a crash
// interrupted (see storeSnapshot). found reports whether there was one.
func (p *Partition) finishPendingSnapshot(log *seglog.Log) (found bool, err error) {
	raw, err := vfs.ReadFileMax(p.cfg.FS, filepath.Join(p.cfg.Dir, snapshotPendingFile), raftSnapshotBytesMax+(1<<20))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("partition %s: %w", p, err)
	}
	snap, err := decodePendingSnapshot(raw)
	if err != nil {
		return false, p.damaged("%w", err)
	}
	if _, _, _, err := p.storeSnapshot(log, snap); err != nil {
		if errors.Is(err, ErrDamaged) {
			return false, p.damaged("%w", err)
		}
		return false, fmt.Errorf("partition %s: %w", p, err)
	}
	// What the journal replayed predates the snapshot (its reset record
	// is committed before the pending file goes, and nothing is appended
	// before that).
	p.cfg.WALReplay = nil
	p.logger.Warn("raft snapshot install finished after a crash", "index", snap.Metadata.Index)
	return true, nil
}

// applySnapshot loads the queue state of an installed snapshot.
func (p *Partition) applySnapshot(snap *raftpb.Snapshot) error {
	index := snap.Metadata.Index
	if index <= p.applied {
		return nil
	}
	if p.leads {
		return errors.New("a leader was sent a snapshot")
	}
	if err := p.rebuild(index); err != nil {
		return err
	}
	p.applied, p.committed = index, max(p.committed, index)
	p.nextLSN, p.lastLSN = index+1, index
	p.rs.SetApplied(index)
	return nil
}
