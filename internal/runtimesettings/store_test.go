package runtimesettings

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

const dir = "/data"

func memFS(t *testing.T) *vfs.MemFS {
	t.Helper()
	fs := vfs.NewMem()
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fs.SyncDir("/"); err != nil {
		t.Fatal(err)
	}
	return fs
}

func open(t *testing.T, fs vfs.FS, seed map[string]int64) *Store {
	t.Helper()
	s, err := Open(fs, dir, seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSeedOnlyWhenNoDocument(t *testing.T) {
	fs := memFS(t)
	s := open(t, fs, map[string]int64{KeyReconnectGraceMs: 5000})
	if d := s.Snapshot(); d.Version != 1 || d.Values[KeyReconnectGraceMs] != 5000 {
		t.Fatalf("seeded %+v", d)
	}
	// The seed was written durably: it survives a crash.
	fs2 := fs.Crash(rand.New(rand.NewPCG(1, 2)), true)
	s2 := open(t, fs2, map[string]int64{KeyReconnectGraceMs: 7000})
	if d := s2.Snapshot(); d.Version != 1 || d.Values[KeyReconnectGraceMs] != 5000 {
		t.Fatalf("a later seed replaced the document: %+v", d)
	}
	if _, err := s2.Update(1, map[string]int64{KeyReconnectGraceMs: 250}); err != nil {
		t.Fatal(err)
	}
	s3 := open(t, fs2, map[string]int64{KeyReconnectGraceMs: 5000})
	if d := s3.Snapshot(); d.Version != 2 || s3.Int(KeyReconnectGraceMs) != 250 {
		t.Fatalf("reopened %+v", d)
	}
}

func TestSeedDefaultsAndValidation(t *testing.T) {
	s := open(t, memFS(t), nil)
	if got := s.Int(KeyReconnectGraceMs); got != 0 {
		t.Fatalf("library default grace %d, want 0", got)
	}
	if _, err := Open(memFS(t), dir, map[string]int64{"connection.nope": 1}, nil); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unknown seed key: %v", err)
	}
	if _, err := Open(memFS(t), dir, map[string]int64{KeyReconnectGraceMs: -1}, nil); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("negative seed: %v", err)
	}
}

func TestUpdate(t *testing.T) {
	s := open(t, memFS(t), map[string]int64{KeyReconnectGraceMs: 5000})
	d, err := s.Update(1, map[string]int64{KeyReconnectGraceMs: 100})
	if err != nil || d.Version != 2 || d.Values[KeyReconnectGraceMs] != 100 || s.Int(KeyReconnectGraceMs) != 100 {
		t.Fatalf("update: %+v %v", d, err)
	}
	var ce *ConflictError
	if _, err := s.Update(1, map[string]int64{KeyReconnectGraceMs: 7}); !errors.As(err, &ce) || !errors.Is(err, ErrVersionConflict) ||
		ce.Current.Version != 2 || ce.Current.Values[KeyReconnectGraceMs] != 100 {
		t.Fatalf("stale version: %v", err)
	}
	for _, tc := range []struct {
		changes map[string]int64
		want    error
		msg     string
	}{
		{map[string]int64{"connection.bogus_ms": 1}, ErrUnknownKey, "connection.bogus_ms: not a runtime setting"},
		{map[string]int64{KeyReconnectGraceMs: -5}, ErrOutOfRange, "connection.reconnect_grace_ms: -5 is out of range 0..2147483648"},
		{map[string]int64{KeyReconnectGraceMs: 1<<31 + 1}, ErrOutOfRange, "out of range"},
		{map[string]int64{KeyReconnectGraceMs: 9, "x": 1}, ErrUnknownKey, "x: not a runtime setting"},
		{nil, ErrNoChange, "no runtime settings"},
	} {
		if _, err := s.Update(2, tc.changes); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: got %v, want %v containing %q", tc.changes, err, tc.want, tc.msg)
		}
	}
	if d := s.Snapshot(); d.Version != 2 || d.Values[KeyReconnectGraceMs] != 100 {
		t.Fatalf("a rejected change altered the document: %+v", d)
	}
}

// A write that fails leaves the old document in force, in memory and on disk.
func TestUpdateWriteFailure(t *testing.T) {
	fs := memFS(t)
	s := open(t, fs, map[string]int64{KeyReconnectGraceMs: 5000})
	fs.SetSyncError(errors.New("input/output error"))
	if _, err := s.Update(1, map[string]int64{KeyReconnectGraceMs: 1}); err == nil || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("update with failing fsync: %v", err)
	}
	fs.SetSyncError(nil)
	if s.Int(KeyReconnectGraceMs) != 5000 || s.Snapshot().Version != 1 {
		t.Fatalf("failed write became visible: %+v", s.Snapshot())
	}
	if d := open(t, fs, nil).Snapshot(); d.Version != 1 || d.Values[KeyReconnectGraceMs] != 5000 {
		t.Fatalf("on disk after failed write: %+v", d)
	}
}

// A crash at any point of a series of updates leaves the last confirmed
// document or a later one, whole: never a torn or reset one.
func TestCrashKeepsConfirmedVersion(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 9))
		fs := memFS(t)
		s := open(t, fs, map[string]int64{KeyReconnectGraceMs: 5000})
		confirmed := Doc{Version: 1, Values: map[string]int64{KeyReconnectGraceMs: 5000}}
		steps := rng.IntN(6)
		for range steps {
			d, err := s.Update(confirmed.Version, map[string]int64{KeyReconnectGraceMs: rng.Int64N(100_000)})
			if err != nil {
				t.Fatal(err)
			}
			confirmed = d
		}
		// An update in flight at the crash: its file writes happened, its
		// syncs may not have.
		fs.SetSyncError(errors.New("crash"))
		inflight := rng.Int64N(100_000)
		s.Update(confirmed.Version, map[string]int64{KeyReconnectGraceMs: inflight})
		after := fs.Crash(rng, true)
		d := open(t, after, nil).Snapshot()
		switch {
		case d.Version == confirmed.Version && d.Values[KeyReconnectGraceMs] == confirmed.Values[KeyReconnectGraceMs]:
		case d.Version == confirmed.Version+1 && d.Values[KeyReconnectGraceMs] == inflight:
		default:
			t.Fatalf("seed %d: after crash %+v, confirmed %+v (in flight %d)", seed, d, confirmed, inflight)
		}
	}
}

func TestCorruptDocumentIsAnError(t *testing.T) {
	good := func(t *testing.T) (*vfs.MemFS, []byte) {
		fs := memFS(t)
		s := open(t, fs, map[string]int64{KeyReconnectGraceMs: 5000})
		if _, err := s.Update(1, map[string]int64{KeyReconnectGraceMs: 1234}); err != nil {
			t.Fatal(err)
		}
		data, err := fs.ReadFile(filepath.Join(dir, FileName))
		if err != nil {
			t.Fatal(err)
		}
		return fs, data
	}
	_, data := good(t)
	for name, mutate := range map[string]func([]byte) []byte{
		"digit changed": func(b []byte) []byte { return bytes.Replace(b, []byte("1234"), []byte("1235"), 1) },
		"truncated":     func(b []byte) []byte { return b[:len(b)/2] },
		"empty":         func([]byte) []byte { return nil },
		"version zeroed": func(b []byte) []byte {
			return bytes.Replace(b, []byte(`"version": 2`), []byte(`"version": 0`), 1)
		},
		"unknown key": func([]byte) []byte {
			return encode(Doc{Version: 3, Values: map[string]int64{KeyReconnectGraceMs: 1, "connection.future_ms": 2}})
		},
		"out of range": func([]byte) []byte {
			return encode(Doc{Version: 3, Values: map[string]int64{KeyReconnectGraceMs: -1}})
		},
		"unknown field": func(b []byte) []byte { return bytes.Replace(b, []byte(`"crc32c"`), []byte(`"extra": 1, "crc32c"`), 1) },
		"trailing data": func(b []byte) []byte { return append(b, []byte("{}")...) },
	} {
		t.Run(name, func(t *testing.T) {
			fs, _ := good(t)
			if err := fs.WriteFile(filepath.Join(dir, FileName), mutate(bytes.Clone(data))); err != nil {
				t.Fatal(err)
			}
			_, err := Open(fs, dir, map[string]int64{KeyReconnectGraceMs: 5000}, nil)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), FileName) {
				t.Fatalf("open: %v, want ErrCorrupt naming the file", err)
			}
			// Never silently reset: the bad file is still there, untouched.
			if now, _ := fs.ReadFile(filepath.Join(dir, FileName)); !bytes.Equal(now, mutate(bytes.Clone(data))) {
				t.Fatal("Open rewrote a corrupt document")
			}
		})
	}
	t.Run("bit flips", func(t *testing.T) {
		// Any single flipped bit in the settings or the checksum is caught
		// or leaves the document meaning the same (insignificant whitespace).
		for off := range int64(len(data)) {
			fs, _ := good(t)
			if err := fs.FlipBit(filepath.Join(dir, FileName), off, uint(off%8)); err != nil {
				t.Fatal(err)
			}
			s, err := Open(fs, dir, nil, nil)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("offset %d: %v", off, err)
				}
				continue
			}
			if d := s.Snapshot(); d.Version != 2 || d.Values[KeyReconnectGraceMs] != 1234 {
				t.Fatalf("offset %d: flipped bit accepted as %+v", off, d)
			}
		}
	})
}

// A key the document lacks (added by a later release) is filled from the
// seed, and the version moves on.
func TestMissingKeyFilledFromSeed(t *testing.T) {
	fs := memFS(t)
	if err := fs.WriteFile(filepath.Join(dir, FileName), encode(Doc{Version: 4, Values: map[string]int64{}})); err != nil {
		t.Fatal(err)
	}
	s := open(t, fs, map[string]int64{KeyReconnectGraceMs: 5000})
	if d := s.Snapshot(); d.Version != 5 || d.Values[KeyReconnectGraceMs] != 5000 {
		t.Fatalf("%+v", d)
	}
	if d := open(t, fs, nil).Snapshot(); d.Version != 5 || d.Values[KeyReconnectGraceMs] != 5000 {
		t.Fatalf("not persisted: %+v", d)
	}
}

func TestDocumentIsReadable(t *testing.T) {
	fs := memFS(t)
	open(t, fs, map[string]int64{KeyReconnectGraceMs: 5000})
	data, _ := fs.ReadFile(filepath.Join(dir, FileName))
	if !strings.Contains(string(data), `"connection.reconnect_grace_ms": 5000`) || !strings.Contains(string(data), `"version": 1`) {
		t.Fatalf("document:\n%s", data)
	}
}

// Every mutation in TestCorruptDocumentIsAnError must change the file, or the
// case tests nothing.
func TestCorruptMutationsChangeTheFile(t *testing.T) {
	data := encode(Doc{Version: 2, Values: map[string]int64{KeyReconnectGraceMs: 1234}})
	for _, pat := range []string{"1234", `"version": 2`, `"crc32c"`} {
		if !bytes.Contains(data, []byte(pat)) {
			t.Errorf("document lacks %q:\n%s", pat, data)
		}
	}
}

// Concurrent changes based on the same version: exactly one wins, the others
// get ErrVersionConflict, and the winner's value is the one in force.
func TestConcurrentUpdatesOneWins(t *testing.T) {
	s := open(t, memFS(t), map[string]int64{KeyReconnectGraceMs: 5000})
	const racers = 8
	type result struct {
		v   int64
		err error
	}
	results := make(chan result, racers)
	for i := range int64(racers) {
		go func() {
			_, err := s.Update(1, map[string]int64{KeyReconnectGraceMs: 100 + i})
			results <- result{100 + i, err}
		}()
	}
	won := int64(-1)
	for range racers {
		r := <-results
		switch {
		case r.err == nil:
			if won >= 0 {
				t.Fatalf("two updates of version 1 both won (%d and %d)", won, r.v)
			}
			won = r.v
		case !errors.Is(r.err, ErrVersionConflict):
			t.Fatalf("loser got %v", r.err)
		}
	}
	if d := s.Snapshot(); won < 0 || d.Version != 2 || d.Values[KeyReconnectGraceMs] != won {
		t.Fatalf("winner %d, document %+v", won, d)
	}
}

// TestUpdateThroughACommitter: with a Committer (a cluster) a change is
// based on the adopted document, committed by the committer and on disk
// before Update returns; a lost race is a conflict carrying the winner,
// which is adopted; a commit failure changes nothing and matches
// ErrNotCommitted; Adopt takes a lower version (a node joining a cluster)
// and refuses bad values.
func TestUpdateThroughACommitter(t *testing.T) {
	fs := memFS(t)
	s := open(t, fs, nil)
	// A local document at version 4; the cluster's is version 2.
	for v := uint64(1); v < 4; v++ {
		if _, err := s.Update(v, map[string]int64{KeyReconnectGraceMs: int64(v)}); err != nil {
			t.Fatal(err)
		}
	}
	cluster := Doc{Version: 2, Values: map[string]int64{KeyReconnectGraceMs: 7000}}
	if err := s.Adopt(cluster); err != nil {
		t.Fatal(err)
	}
	if d := s.Snapshot(); d.Version != 2 || d.Values[KeyReconnectGraceMs] != 7000 || d.Values[KeyDrainTimeoutMs] != 10_000 {
		t.Fatalf("after adopting the cluster's document: %+v", d)
	}
	var commitErr error
	race := false
	s.SetCommitter(func(expected uint64, next Doc) (Doc, bool, error) {
		if commitErr != nil {
			return Doc{}, false, commitErr
		}
		if race {
			return Doc{Version: expected + 1, Values: map[string]int64{KeyReconnectGraceMs: 1}}, false, nil
		}
		if expected != cluster.Version || next.Version != expected+1 {
			t.Errorf("committer got expected %d next %d", expected, next.Version)
		}
		cluster = next
		return next, true, nil
	})
	d, err := s.Update(2, map[string]int64{KeyReconnectGraceMs: 9000})
	if err != nil || d.Version != 3 || d.Values[KeyReconnectGraceMs] != 9000 {
		t.Fatalf("update through the committer: %+v, %v", d, err)
	}
	if got := open(t, fs, nil).Snapshot(); got.Version != 3 || got.Values[KeyReconnectGraceMs] != 9000 {
		t.Fatalf("document on disk after the update: %+v", got)
	}
	if _, err := s.Update(2, map[string]int64{KeyReconnectGraceMs: 1}); !errors.Is(err, ErrVersionConflict) {
		t.Fatalf("stale version: %v", err)
	}
	race = true
	var ce *ConflictError
	if _, err := s.Update(3, map[string]int64{KeyReconnectGraceMs: 5}); !errors.As(err, &ce) || ce.Current.Version != 4 {
		t.Fatalf("lost race: %v", err)
	}
	if d := s.Snapshot(); d.Version != 4 || d.Values[KeyReconnectGraceMs] != 1 {
		t.Fatalf("the race's winner was not adopted: %+v", d)
	}
	race, commitErr = false, errors.New("no leader")
	if _, err := s.Update(4, map[string]int64{KeyReconnectGraceMs: 5}); !errors.Is(err, ErrNotCommitted) {
		t.Fatalf("failed commit: %v", err)
	}
	if d := s.Snapshot(); d.Version != 4 {
		t.Fatalf("a failed commit changed the document: %+v", d)
	}
	if err := s.Adopt(Doc{Version: 9, Values: map[string]int64{KeyReconnectGraceMs: -1}}); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("adopting a bad value: %v", err)
	}
}
