package seglog

import (
	"bytes"
	"errors"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

// FuzzDecodeRecord: DecodeRecord never panics, never claims more bytes than
// it was given, and whatever it accepts re-encodes to the same bytes.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(AppendRecord(nil, 1, 2, []byte("hello")))
	f.Add(AppendRecord(nil, 1<<40, 255, nil))
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
		if again := AppendRecord(nil, rec.LSN, rec.Type, rec.Payload); !bytes.Equal(again, b[:n]) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzOpen: Open on a segment file holding arbitrary bytes never panics; it
// either opens (and then accepts a commit and reopens cleanly) or fails with
// a *CorruptionError. Under CorruptionTruncate it always opens.
func FuzzOpen(f *testing.F) {
	var good []byte
	for i := uint64(1); i <= 5; i++ {
		good = AppendRecord(good, i, 1, bytes.Repeat([]byte{byte(i)}, int(i*7)))
	}
	f.Add(good, false)
	f.Add(good[:len(good)-3], true)
	f.Add(append(append([]byte{}, good...), make([]byte, 100)...), false)
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
