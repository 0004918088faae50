package seglog

import (
	"bytes"
	"errors"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

// FuzzDecodeRecord: DecodeRecord (version 2) never panics, never claims more
// bytes than it was given, and whatever it accepts re-encodes to the same
// bytes.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(AppendRecord(nil, 1, 1, 2, []byte("hello")))
	f.Add(AppendRecord(nil, 1<<40, 7, 255, nil))
	f.Add(make([]byte, headerBytes))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, n, err := DecodeRecord(b)
		if err != nil {
			if n != 0 {
				t.Fatalf("error %v with size %d", err, n)
			}
			return
		}
		if n < headerBytes || n > len(b) {
			t.Fatalf("size %d for %d input bytes", n, len(b))
		}
		if again := AppendRecord(nil, rec.LSN, rec.Term, rec.Type, rec.Payload); !bytes.Equal(again, b[:n]) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzDecodeRecordV1: the version-1 decoder never panics, never claims more
// bytes than it was given, and reports term 1.
func FuzzDecodeRecordV1(f *testing.F) {
	f.Add(make([]byte, headerBytesV1))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, n, err := DecodeRecordV1(b)
		if err != nil {
			if n != 0 {
				t.Fatalf("error %v with size %d", err, n)
			}
			return
		}
		if n < headerBytesV1 || n > len(b) || rec.Term != 1 || n != headerBytesV1+len(rec.Payload) {
			t.Fatalf("size %d term %d for %d input bytes", n, rec.Term, len(b))
		}
	})
}

// FuzzSegmentHeader: DecodeSegmentHeader never panics, and whatever it
// accepts re-encodes to the same bytes.
func FuzzSegmentHeader(f *testing.F) {
	f.Add(encodeSegHeader(1, 0))
	f.Add(encodeSegHeader(1<<40, 9))
	f.Add(make([]byte, segHeaderBytes))
	f.Fuzz(func(t *testing.T, b []byte) {
		base, prev, err := DecodeSegmentHeader(b)
		if err != nil {
			return
		}
		if again := encodeSegHeader(base, prev); !bytes.Equal(again, b[:segHeaderBytes]) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzOpen: Open on a segment file holding arbitrary bytes (version 1 or 2)
// never panics; it either opens (and then accepts a commit and reopens
// cleanly) or fails with a *CorruptionError. Under CorruptionTruncate it
// always opens.
func FuzzOpen(f *testing.F) {
	var v1, v2 []byte
	v2 = encodeSegHeader(1, 0)
	for i := uint64(1); i <= 5; i++ {
		p := bytes.Repeat([]byte{byte(i)}, int(i*7))
		v1 = append(v1, encodeV1(i, 1, p)...)
		v2 = AppendRecord(v2, i, 1+i/3, 1, p)
	}
	for _, good := range [][]byte{v1, v2} {
		f.Add(good, false)
		f.Add(good[:len(good)-3], true)
		f.Add(append(append([]byte{}, good...), make([]byte, 100)...), false)
	}
	f.Add(v2[:segHeaderBytes-5], false)
	f.Add([]byte("not a log at all"), true)
	f.Fuzz(func(t *testing.T, data []byte, truncate bool) {
		if len(data) > 1<<20 {
			return
		}
		fs := vfs.NewMem()
		if err := fs.MkdirAll("log", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := fs.WriteFile("log/"+SegmentName(1), data); err != nil {
			t.Fatal(err)
		}
		o := Options{FS: fs, Dir: "log", SegmentBytes: 4096}
		if truncate {
			o.Corruption = CorruptionTruncate
		}
		l, err := Open(o)
		if err != nil {
			var ce *CorruptionError
			if truncate || !errors.As(err, &ce) {
				t.Fatalf("Open: %v", err)
			}
			return
		}
		next := l.NextLSN()
		if _, err := l.Commit(0, []byte("x")); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		o.Corruption = CorruptionStop
		l, err = Open(o)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		if l.NextLSN() != next+1 {
			t.Fatalf("reopen next %d, want %d", l.NextLSN(), next+1)
		}
		_ = l.Close()
	})
}

// encodeV1 encodes a version-1 record (the old writer's format) for tests.
func encodeV1(lsn uint64, typ uint8, payload []byte) []byte {
	v2 := AppendRecord(nil, lsn, 0, typ, payload)
	b := make([]byte, headerBytesV1+len(payload))
	copy(b[4:16], v2[4:16])
	b[16] = typ
	copy(b[headerBytesV1:], payload)
	putU32(b[0:4], recordCRC(payloadCRC(payload), b[4:headerBytesV1]))
	return b
}

// FuzzHardStateFile: Open on a HardState file holding arbitrary bytes never
// panics and yields either a state that some valid slot holds or the empty
// state; a slot that verifies re-encodes to the same bytes.
func FuzzHardStateFile(f *testing.F) {
	f.Add(encodeHSSlot(1, 2, 3, 4, []byte{8, 1}))
	f.Add(append(make([]byte, hsSlotBytes), encodeHSSlot(7, 1, 1, 1, nil)...))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 2*hsSlotBytes {
			return
		}
		if seq, st, ok := decodeHSSlot(data); ok {
			if again := encodeHSSlot(seq, st.term, st.vote, st.commit, st.conf); !bytes.Equal(again, data[:len(again)]) {
				t.Fatalf("re-encoding differs")
			}
		}
		fs := vfs.NewMem()
		if err := fs.MkdirAll("log", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := fs.WriteFile("log/"+hardStateName, data); err != nil {
			t.Fatal(err)
		}
		l, err := Open(Options{FS: fs, Dir: "log", SegmentBytes: 4096})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer l.Close()
		_ = l.HardState()
		_, _ = l.ConfState() // may fail on garbage that passed the CRC; must not panic
	})
}
