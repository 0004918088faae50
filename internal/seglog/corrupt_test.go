package seglog

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

const (
	cPayload = 100
	cRecord  = headerBytes + cPayload // 125 bytes
	cH       = segHeaderBytes         // records start after the segment header
	cPerSeg  = (4096 - cH) / cRecord  // 32 records per 4 KiB segment
)

// cPayloadFor never ends in a zero byte, so a damaged last record is never
// mistaken for a cut-short write (whose tail would be zeros).
func cPayloadFor(lsn uint64) []byte {
	p := payloadFor(lsn, cPayload)
	p[len(p)-1] |= 1
	return p
}

// buildLog writes n records of cRecord bytes into 4 KiB segments and closes.
func buildLog(t *testing.T, n int, prealloc bool) (*vfs.MemFS, Options) {
	t.Helper()
	fs := vfs.NewMem()
	o := Options{FS: fs, Dir: "log", SegmentBytes: 4096, IndexIntervalBytes: 512}
	if !prealloc {
		o.Preallocate = PreallocNone
	}
	l := openT(t, o)
	for i := uint64(1); i <= uint64(n); i++ {
		if _, err := l.Append(3, cPayloadFor(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return fs, o
}

func segPath(base uint64) string { return filepath.Join("log", SegmentName(base)) }

// expectCorruption opens under both policies: Stop must fail naming the
// segment and offset; Truncate must open holding exactly records 1..keep.
func expectCorruption(t *testing.T, fs *vfs.MemFS, o Options, seg string, off int64, keep uint64) {
	t.Helper()
	o.FS = fs
	_, err := Open(o)
	var ce *CorruptionError
	if !errors.As(err, &ce) {
		t.Fatalf("Open under CorruptionStop: %v, want *CorruptionError", err)
	}
	if ce.Segment != seg || ce.FileOffset != off || ce.LSN != keep+1 {
		t.Fatalf("corruption at %s:%d lsn %d (%s), want %s:%d lsn %d", ce.Segment, ce.FileOffset, ce.LSN, ce.Reason, seg, off, keep+1)
	}
	// Stop changed nothing: a second attempt sees the same damage.
	if _, err2 := Open(o); !errors.As(err2, &ce) || ce.FileOffset != off {
		t.Fatalf("second Open: %v", err2)
	}

	o.Corruption = CorruptionTruncate
	l, err := Open(o)
	if err != nil {
		t.Fatalf("Open under CorruptionTruncate: %v", err)
	}
	rep := l.Report()
	if !rep.Truncated || rep.Corruption == nil || rep.Corruption.FileOffset != off || rep.LastLSN != keep {
		t.Fatalf("report %+v (corruption %+v), want cut after lsn %d", rep, rep.Corruption, keep)
	}
	if l.NextLSN() != keep+1 {
		t.Fatalf("NextLSN %d, want %d", l.NextLSN(), keep+1)
	}
	if keep > 0 {
		if r, err := l.Read(keep); err != nil || !bytes.Equal(r.Payload, cPayloadFor(keep)) {
			t.Fatalf("Read(%d) after cut: %v", keep, err)
		}
	}
	if lsn, err := l.Commit(1, []byte("after cut")); err != nil || lsn != keep+1 {
		t.Fatalf("Commit after cut = %d, %v", lsn, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	o.Corruption = CorruptionStop
	l, err = Open(o)
	if err != nil {
		t.Fatalf("reopen after cut: %v", err)
	}
	_ = l.Close()
}

func TestCorruptionFlippedBitInMiddleRecord(t *testing.T) {
	fs, o := buildLog(t, 20, false)
	// Record 8 starts at cH+7*cRecord; flip a payload bit.
	if err := fs.FlipBit(segPath(1), cH+7*cRecord+headerBytes+10, 2); err != nil {
		t.Fatal(err)
	}
	expectCorruption(t, fs, o, SegmentName(1), cH+7*cRecord, 7)
}

func TestCorruptionFlippedBitInLastRecordIsNotTorn(t *testing.T) {
	fs, o := buildLog(t, 20, false)
	// A complete last record with a bad CRC is damage, not a torn write.
	if err := fs.FlipBit(segPath(1), cH+19*cRecord+headerBytes+50, 0); err != nil {
		t.Fatal(err)
	}
	expectCorruption(t, fs, o, SegmentName(1), cH+19*cRecord, 19)
}

func TestCorruptionFlippedBitInNonLastSegment(t *testing.T) {
	fs, o := buildLog(t, 3*cPerSeg+5, false)
	if err := fs.FlipBit(segPath(cPerSeg+1), cH+4*cRecord+3, 6); err != nil { // header byte of lsn cPerSeg+5
		t.Fatal(err)
	}
	expectCorruption(t, fs, o, SegmentName(cPerSeg+1), cH+4*cRecord, cPerSeg+4)
	names, _ := fs.ReadDir("log")
	if len(names) != 2 {
		t.Fatalf("after cut, segments %v; want the later ones deleted", names)
	}
}

func TestCorruptionTruncatedNonLastSegment(t *testing.T) {
	fs, o := buildLog(t, 3*cPerSeg+5, false)
	// Cut segment 1 on a record boundary: every remaining record is fine,
	// but segment 2 no longer continues where segment 1 ends.
	if err := fs.TruncateFile(segPath(1), cH+30*cRecord); err != nil {
		t.Fatal(err)
	}
	expectCorruption(t, fs, o, SegmentName(1), cH+30*cRecord, 30)
}

func TestCorruptionTruncatedNonLastSegmentMidRecord(t *testing.T) {
	fs, o := buildLog(t, 3*cPerSeg+5, false)
	// Mid-record in a non-last segment is never a torn tail.
	if err := fs.TruncateFile(segPath(cPerSeg+1), cH+10*cRecord+40); err != nil {
		t.Fatal(err)
	}
	expectCorruption(t, fs, o, SegmentName(cPerSeg+1), cH+10*cRecord, cPerSeg+10)
}

func TestCorruptionLengthFlipHidingValidRecords(t *testing.T) {
	fs, o := buildLog(t, 20, false)
	// Grow record 10's length so it seems to run past EOF: a torn-looking
	// tail, but valid records follow the bad one, so it is corruption.
	if err := fs.FlipBit(segPath(1), cH+9*cRecord+4+2, 3); err != nil { // +512 KiB
		t.Fatal(err)
	}
	expectCorruption(t, fs, o, SegmentName(1), cH+9*cRecord, 9)
}

func TestCorruptionZeroedMiddleIsNotATail(t *testing.T) {
	fs, o := buildLog(t, 20, true)
	if err := fs.ZeroRange(segPath(1), cH+5*cRecord, cRecord); err != nil {
		t.Fatal(err)
	}
	expectCorruption(t, fs, o, SegmentName(1), cH+5*cRecord, 5)
}

func TestTornTailIsRepaired(t *testing.T) {
	cases := []struct {
		name     string
		prealloc bool
		damage   func(fs *vfs.MemFS) error
	}{
		{"cut mid-payload", false, func(fs *vfs.MemFS) error { return fs.TruncateFile(segPath(1), cH+19*cRecord+60) }},
		{"cut mid-header", false, func(fs *vfs.MemFS) error { return fs.TruncateFile(segPath(1), cH+19*cRecord+9) }},
		{"preallocated, record tail zero", true, func(fs *vfs.MemFS) error {
			if err := fs.TruncateFile(segPath(1), 4096); err != nil {
				return err
			}
			return fs.ZeroRange(segPath(1), cH+19*cRecord+60, 4096)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs, o := buildLog(t, 20, tc.prealloc)
			if err := tc.damage(fs); err != nil {
				t.Fatal(err)
			}
			l, err := Open(o)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			rep := l.Report()
			if !rep.Truncated || rep.TornBytes <= 0 || rep.Corruption != nil || rep.LastLSN != 19 {
				t.Fatalf("report %+v", rep)
			}
			if lsn, err := l.Commit(1, cPayloadFor(20)); err != nil || lsn != 20 {
				t.Fatalf("Commit after repair = %d, %v", lsn, err)
			}
			_ = l.Close()
			l, err = Open(o)
			if err != nil || l.Report().Truncated || l.NextLSN() != 21 {
				t.Fatalf("reopen: %v %+v", err, l.Report())
			}
			_ = l.Close()
		})
	}
}

func TestZeroTailIsCleanEnd(t *testing.T) {
	fs, o := buildLog(t, 20, false)
	if err := fs.TruncateFile(segPath(1), cH+20*cRecord+3000); err != nil { // zero-extend
		t.Fatal(err)
	}
	l, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if rep := l.Report(); rep.Truncated || rep.TornBytes != 0 || rep.LastLSN != 20 {
		t.Fatalf("report %+v", rep)
	}
	if lsn, err := l.Commit(0, []byte("x")); err != nil || lsn != 21 {
		t.Fatalf("Commit = %d, %v", lsn, err)
	}
}

func TestReadDetectsCorruptionAfterOpen(t *testing.T) {
	fs, o := buildLog(t, 20, false)
	l := openT(t, o)
	defer l.Close()
	if err := fs.FlipBit(segPath(1), cH+12*cRecord+headerBytes+1, 1); err != nil {
		t.Fatal(err)
	}
	var ce *CorruptionError
	if _, err := l.Read(13); !errors.As(err, &ce) || ce.LSN != 13 {
		t.Fatalf("Read(13): %v", err)
	}
	if err := l.Scan(0, func(Record) error { return nil }); !errors.As(err, &ce) || ce.FileOffset != cH+12*cRecord {
		t.Fatalf("Scan: %v", err)
	}
	if _, err := l.Read(12); err != nil {
		t.Fatalf("Read(12): %v", err)
	}
}

func TestReplayFrom(t *testing.T) {
	_, o := buildLog(t, 3*cPerSeg, false)
	var got []uint64
	o.ReplayFrom = 50
	o.Replay = func(r Record) error {
		if !bytes.Equal(r.Payload, cPayloadFor(r.LSN)) {
			t.Errorf("replay lsn %d: wrong payload", r.LSN)
		}
		got = append(got, r.LSN)
		return nil
	}
	l := openT(t, o)
	defer l.Close()
	if len(got) != 3*cPerSeg-49 || got[0] != 50 || l.Report().Replayed != uint64(len(got)) {
		t.Fatalf("replayed %d records from %v", len(got), got[:1])
	}
	stop := errors.New("stop")
	o.Replay = func(Record) error { return stop }
	if _, err := Open(o); !errors.Is(err, stop) {
		t.Fatalf("Open with failing replay: %v", err)
	}
}

func TestCorruptionInSegmentHeader(t *testing.T) {
	// The first segment's header (its base field): the whole log is cut
	// under CorruptionTruncate, leaving an empty log that starts at 1.
	fs, o := buildLog(t, 3*cPerSeg+5, false)
	if err := fs.FlipBit(segPath(1), 20, 1); err != nil {
		t.Fatal(err)
	}
	expectCorruption(t, fs, o, SegmentName(1), 0, 0)

	// A later segment's header: the log is cut where that segment starts.
	fs, o = buildLog(t, 3*cPerSeg+5, false)
	if err := fs.FlipBit(segPath(cPerSeg+1), 3, 0); err != nil { // the magic
		t.Fatal(err)
	}
	expectCorruption(t, fs, o, SegmentName(cPerSeg+1), 0, cPerSeg)
}
