package partition

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

// Checkpoint file layout (Dir/checkpoint). It is written to
// Dir/checkpoint.tmp, synced, renamed over Dir/checkpoint and the directory
// synced, so a crash leaves either the old or the new checkpoint, whole.
//
//	+--------+-----+----------+-----------+=================+----------+
//	| "SNWC" | ver | covers   | snapBytes | queue snapshot  | crc32c   |
//	| 4 B    | u8  | u64 LE   | u32 LE    | snapBytes       | u32 LE   |
//	+--------+-----+----------+-----------+=================+----------+
//	crc32c (Castagnoli) covers every byte before it.
//
// covers is the queue's NextLSN when the snapshot was taken: the snapshot
// reflects every log record with LSN < covers, so recovery restores it and
// replays the log from covers on.
const (
	ckptMagic      = "SNWC"
	ckptVersion    = 1
	ckptHeaderSize = 4 + 1 + 8 + 4
	// ckptBytesMax bounds the checkpoint recovery will read: a damaged
	// length field must not make it allocate without limit.
	ckptBytesMax = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeCheckpoint frames a queue snapshot.
func encodeCheckpoint(covers uint64, snap []byte) []byte {
	b := make([]byte, 0, ckptHeaderSize+len(snap)+4)
	b = append(b, ckptMagic...)
	b = append(b, ckptVersion)
	b = binary.LittleEndian.AppendUint64(b, covers)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(snap)))
	b = append(b, snap...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeCheckpoint checks the frame and returns the LSN it covers and the
// snapshot, which aliases b.
func decodeCheckpoint(b []byte) (uint64, []byte, error) {
	if len(b) < ckptHeaderSize+4 || string(b[:4]) != ckptMagic {
		return 0, nil, errors.New("not a checkpoint file")
	}
	if b[4] != ckptVersion {
		return 0, nil, fmt.Errorf("checkpoint version %d, want %d", b[4], ckptVersion)
	}
	covers := binary.LittleEndian.Uint64(b[5:])
	n := int(binary.LittleEndian.Uint32(b[13:]))
	if len(b) != ckptHeaderSize+n+4 {
		return 0, nil, fmt.Errorf("checkpoint is %d bytes, header says %d", len(b), ckptHeaderSize+n+4)
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return 0, nil, errors.New("checkpoint checksum mismatch")
	}
	return covers, body[ckptHeaderSize:], nil
}

// readFile returns the whole file, or (nil, nil) if it does not exist.
func readFile(fsys vfs.FS, name string) ([]byte, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > ckptBytesMax {
		return nil, fmt.Errorf("%s: %d bytes exceeds %d", name, fi.Size(), ckptBytesMax)
	}
	b := make([]byte, fi.Size())
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, err
	}
	return b, nil
}

// WriteFileAtomic replaces name with data durably; see vfs.WriteFileAtomic.
func WriteFileAtomic(fsys vfs.FS, name string, data []byte) error {
	return vfs.WriteFileAtomic(fsys, name, data)
}

// checkpoint writes the queue snapshot and then drops log segments that
// neither recovery (below the checkpoint) nor delivery (below every live
// message's body, see relocate.go) can need. Called from the actor goroutine, or from Close after it stopped.
func (p *Partition) checkpoint() error {
	// Everything applied must be durable before a checkpoint claims it;
	// under SyncAlways it already is, under SyncInterval this forces it.
	if _, err := p.log.Sync(); err != nil {
		return fmt.Errorf("checkpoint: sync log: %w", err)
	}
	covers := p.st.NextLSN()
	if covers == p.ckptLSN && p.sinceCkpt == 0 {
		return nil
	}
	data := encodeCheckpoint(covers, p.st.Snapshot(nil))
	if err := WriteFileAtomic(p.cfg.FS, p.ckptPath(), data); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	p.ckptLSN = covers
	p.sinceCkpt = 0
	if p.cfg.noRetention {
		return nil
	}
	floor := p.retentionFloor(covers)
	if segs := p.log.Segments(); floor == covers && covers == p.log.NextLSN() &&
		segs[len(segs)-1].Bytes >= rotateBytesMin {
		// Nothing in the log is needed any more, the active segment
		// included: start an empty one so that this one can go too.
		if err := p.log.Rotate(); err != nil {
			return fmt.Errorf("checkpoint: rotate: %w", err)
		}
	}
	if _, err := p.log.DropBefore(floor); err != nil {
		return fmt.Errorf("checkpoint: retention: %w", err)
	}
	return nil
}

// recover restores the checkpoint (if any) and replays the log after it.
func (p *Partition) recover() error {
	cfg := &p.cfg
	if err := cfg.FS.MkdirAll(p.logPath(), 0o755); err != nil {
		return fmt.Errorf("partition %s: %w", p, err)
	}
	// Make the directories themselves durable: a synced log in a
	// directory whose entry was never synced is lost with it.
	for _, d := range []string{cfg.Dir, filepath.Dir(cfg.Dir)} {
		if err := cfg.FS.SyncDir(d); err != nil {
			return fmt.Errorf("partition %s: %w", p, err)
		}
	}
	damaged := func(format string, args ...any) error {
		return fmt.Errorf("%w: partition %s: %w", ErrDamaged, p, fmt.Errorf(format, args...))
	}
	raw, err := readFile(cfg.FS, p.ckptPath())
	if err != nil {
		return fmt.Errorf("partition %s: read checkpoint: %w", p, err)
	}
	st := queue.New(cfg.Queue)
	var covers uint64
	if raw != nil {
		c, snap, err := decodeCheckpoint(raw)
		if err != nil {
			return damaged("checkpoint: %w", err)
		}
		st, err = queue.Restore(cfg.Queue, snap)
		if err != nil {
			return damaged("checkpoint: %w", err)
		}
		if st.NextLSN() != c {
			return damaged("checkpoint covers lsn %d but its snapshot ends at %d", c, st.NextLSN())
		}
		covers = c
	}
	log, err := seglog.Open(seglog.Options{
		FS:             cfg.FS,
		Dir:            p.logPath(),
		SegmentBytes:   cfg.SegmentBytes,
		Sync:           cfg.Sync,
		SyncIntervalMs: cfg.SyncIntervalMs,
		Corruption:     cfg.Corruption,
		Preallocate:    cfg.Preallocate,
		Logger:         p.logger,
		ReplayFrom:     covers,
		Replay: func(r seglog.Record) error {
			if !queue.IsEventType(r.Type) {
				// Not a queue event: records reserved for later
				// features (producer deduplication) occupy LSNs the
				// queue counts as settled.
				return nil
			}
			ev, err := queue.DecodeEvent(r.Type, r.Payload)
			if err != nil {
				return fmt.Errorf("lsn %d: %w", r.LSN, err)
			}
			return st.Apply(r.LSN, ev)
		},
	})
	if err != nil {
		var ce *seglog.CorruptionError
		if errors.As(err, &ce) || errors.Is(err, queue.ErrCorrupt) {
			return damaged("%w", err)
		}
		return fmt.Errorf("partition %s: open log: %w", p, err)
	}
	first, next := log.FirstLSN(), log.NextLSN()
	switch {
	case raw == nil && first > 1:
		err = damaged("no checkpoint, and the log starts at lsn %d", first)
	case raw != nil && first > max(covers, 1):
		err = damaged("checkpoint covers lsn %d, but the log starts at %d", covers, first)
	case raw != nil && next < covers:
		err = damaged("checkpoint covers lsn %d, but the log ends before %d", covers, next)
	}
	if err != nil {
		log.Close()
		return err
	}
	if rep := log.Report(); rep.Corruption != nil || rep.TornBytes > 0 {
		p.logger.Warn("partition log repaired at open", "torn_bytes", rep.TornBytes,
			"corruption", rep.Corruption, "dropped_segments", rep.DroppedSegments)
	}
	p.log, p.st, p.ckptLSN = log, st, covers
	for _, in := range st.PendingDeadLetters() {
		p.deadLetters[in.Offset] = &deadLetter{}
	}
	p.recovered = st.Leases()
	return nil
}
