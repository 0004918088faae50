package seglog

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

// v1FixturePayload is the payload of record lsn in testdata/v1*/ (see
// testdata/README.md).
func v1FixturePayload(lsn uint64) []byte {
	b := make([]byte, 50+int(lsn*37%400))
	for i := range b {
		b[i] = byte(lsn*131 + uint64(i))
	}
	return b
}

// loadFixture copies testdata/<name>/ into a MemFS directory "log".
func loadFixture(t *testing.T, name string) *vfs.MemFS {
	t.Helper()
	fs := vfs.NewMem()
	if err := fs.MkdirAll("log", 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("testdata", name, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := fs.WriteFile(filepath.Join("log", e.Name()), b); err != nil {
			t.Fatal(err)
		}
	}
	return fs
}

// TestUpgradeV1Log opens logs written by the version-1 writer: every record
// reads back (term 1), new records go to a new version-2 segment, the log
// reopens cleanly, and once retention drops the old segments only version-2
// files remain.
func TestUpgradeV1Log(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first uint64
	}{{"v1log", 1}, {"v1dropped", 18}} {
		t.Run(tc.name, func(t *testing.T) {
			fs := loadFixture(t, tc.name)
			o := Options{FS: fs, Dir: "log", SegmentBytes: 4096, IndexIntervalBytes: 256}
			check := func(l *Log, upto uint64) {
				t.Helper()
				if l.FirstLSN() != tc.first {
					t.Fatalf("FirstLSN %d, want %d", l.FirstLSN(), tc.first)
				}
				want := tc.first
				err := l.Scan(0, func(r Record) error {
					if r.LSN != want {
						t.Fatalf("scan lsn %d, want %d", r.LSN, want)
					}
					want++
					if r.LSN <= 60 && (r.Term != 1 || r.Type != uint8(r.LSN%7) || !bytes.Equal(r.Payload, v1FixturePayload(r.LSN))) {
						t.Fatalf("lsn %d: term %d type %d, payload matches %v", r.LSN, r.Term, r.Type, bytes.Equal(r.Payload, v1FixturePayload(r.LSN)))
					}
					return nil
				})
				if err != nil || want != upto+1 {
					t.Fatalf("scan ended at %d (want %d): %v", want, upto+1, err)
				}
				if r, err := l.Read(tc.first + 3); err != nil || !bytes.Equal(r.Payload, v1FixturePayload(tc.first+3)) {
					t.Fatalf("Read: %v", err)
				}
				if term, err := l.Term(tc.first - 1); err != nil || term != min(tc.first-1, 1) {
					t.Fatalf("Term(%d) = %d, %v", tc.first-1, term, err)
				}
			}
			l := openT(t, o)
			if l.NextLSN() != 61 {
				t.Fatalf("NextLSN %d, want 61", l.NextLSN())
			}
			check(l, 60)
			segs := l.Segments()
			if last := segs[len(segs)-1]; last.Base != 61 || last.Bytes != 0 {
				t.Fatalf("the active segment should be a new empty one at 61: %+v", segs)
			}
			// New records are version 2 in the new segment; the old-API
			// append takes the current term, 1.
			for i := uint64(61); i <= 90; i++ {
				if _, err := l.Commit(9, payloadFor(i, 200)); err != nil {
					t.Fatal(err)
				}
			}
			if term, err := l.Term(90); err != nil || term != 1 {
				t.Fatalf("Term(90) = %d, %v", term, err)
			}
			if err := l.AppendAt(91, 4, 9, payloadFor(91, 10)); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			b, err := fs.ReadFile(filepath.Join("log", SegmentName(61)))
			if err != nil || !bytes.HasPrefix(b, segMagic[:]) {
				t.Fatalf("segment 61 is not version 2: %v", err)
			}
			l = openT(t, o)
			if rep := l.Report(); rep.Truncated {
				t.Fatalf("clean reopen reported %+v", rep)
			}
			check(l, 91)
			if term, err := l.Term(91); err != nil || term != 4 {
				t.Fatalf("Term(91) = %d, %v", term, err)
			}
			// Retention retires the version-1 files.
			if _, err := l.DropBefore(61); err != nil {
				t.Fatal(err)
			}
			if l.FirstLSN() != 61 {
				t.Fatalf("FirstLSN after DropBefore %d", l.FirstLSN())
			}
			if term, err := l.Term(60); err != nil || term != 1 {
				t.Fatalf("Term(60) after drop = %d, %v", term, err)
			}
			_ = l.Close()
			names, _ := fs.ReadDir("log")
			for _, n := range names {
				if base, ok := parseSegmentName(n); ok {
					b, _ := fs.ReadFile(filepath.Join("log", n))
					if !bytes.HasPrefix(b, segMagic[:]) {
						t.Fatalf("version-1 segment %d still present", base)
					}
				}
			}
			l = openT(t, o)
			if term, err := l.Term(60); err != nil || term != 1 || l.FirstLSN() != 61 || l.NextLSN() != 92 {
				t.Fatalf("after reopen: Term(60) = %d, %v; first %d next %d", term, err, l.FirstLSN(), l.NextLSN())
			}
			_ = l.Close()
		})
	}
}

// TestUpgradeCrashDuringFirstOpen crashes at each file-system operation of
// the first Open of a version-1 log (which seals the version-1 active
// segment and creates a version-2 one), with torn writes: every version-1
// record survives, and the next Open finishes the upgrade.
func TestUpgradeCrashDuringFirstOpen(t *testing.T) {
	crashed := 0
	for crashAt := int64(1); crashAt <= 12; crashAt++ {
		cfs := &crashFS{MemFS: loadFixture(t, "v1log")}
		for _, d := range []string{".", "log"} { // the fixture's names are durable
			if err := cfs.SyncDir(d); err != nil {
				t.Fatal(err)
			}
		}
		img := cfs.MemFS
		fired := false
		cfs.arm(crashAt, func() { fired = true; img = cfs.Crash(rand.New(rand.NewPCG(uint64(crashAt), 3)), true) })
		o := Options{FS: cfs, Dir: "log", SegmentBytes: 4096}
		if l, err := Open(o); err == nil {
			_ = l.Close()
		}
		if !fired {
			continue
		}
		crashed++
		o.FS = img
		l := openT(t, o)
		if l.FirstLSN() != 1 || l.NextLSN() != 61 {
			t.Fatalf("crash at op %d: log [%d, %d)", crashAt, l.FirstLSN(), l.NextLSN())
		}
		for i := uint64(1); i <= 60; i++ {
			if r, err := l.Read(i); err != nil || r.Term != 1 || !bytes.Equal(r.Payload, v1FixturePayload(i)) {
				t.Fatalf("crash at op %d: record %d: %v", crashAt, i, err)
			}
		}
		if lsn, err := l.Commit(1, []byte("after")); err != nil || lsn != 61 {
			t.Fatalf("crash at op %d: Commit = %d, %v", crashAt, lsn, err)
		}
		segs := l.Segments()
		_ = l.Close()
		b, _ := img.ReadFile(filepath.Join("log", SegmentName(segs[len(segs)-1].Base)))
		if !bytes.HasPrefix(b, segMagic[:]) {
			t.Fatalf("crash at op %d: the active segment is not version 2", crashAt)
		}
	}
	if crashed < 5 {
		t.Fatalf("only %d crash points fell inside Open", crashed)
	}
}
