package nodeid

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

func memDir(t *testing.T) *vfs.MemFS {
	t.Helper()
	m := vfs.NewMem()
	if err := m.MkdirAll("/data", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("/"); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCreateThenKeep(t *testing.T) {
	m := memDir(t)
	id, err := Load(m, "/data", bytes.NewReader(bytes.Repeat([]byte{0xab}, idBytes)))
	if err != nil {
		t.Fatal(err)
	}
	if id != "abababababababababababababababab" {
		t.Fatalf("id %q, want the drawn bytes in hex", id)
	}
	// A second start reads the same id and draws nothing.
	again, err := Load(m, "/data", errReader{})
	if err != nil || again != id {
		t.Fatalf("second Load = %q, %v; want %q", again, err, id)
	}
}

func TestRandomIDsDiffer(t *testing.T) {
	a, err := Load(memDir(t), "/data", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Load(memDir(t), "/data", nil)
	if err != nil {
		t.Fatal(err)
	}
	if a == b || len(a) != 2*idBytes {
		t.Fatalf("two new data directories got %q and %q", a, b)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("no randomness here") }

func TestRandomFailureWritesNothing(t *testing.T) {
	m := memDir(t)
	if _, err := Load(m, "/data", errReader{}); err == nil {
		t.Fatal("Load without randomness succeeded")
	}
	if _, err := m.ReadFile("/data/" + FileName); err == nil {
		t.Fatal("an id file was written without an id")
	}
}

// TestDurableOnReturn: once Load returns, a crash keeps the id.
func TestDurableOnReturn(t *testing.T) {
	for seed := range uint64(20) {
		m := memDir(t)
		id, err := Load(m, "/data", nil)
		if err != nil {
			t.Fatal(err)
		}
		img := m.Crash(rand.New(rand.NewPCG(seed, 1)), true)
		got, err := Load(img, "/data", errReader{})
		if err != nil || got != id {
			t.Fatalf("seed %d: after crash %q, %v; want %q", seed, got, err, id)
		}
	}
}

// TestCrashWhileCreating: a crash before the create is durable leaves no
// file or a whole one, never a damaged one.
func TestCrashWhileCreating(t *testing.T) {
	for seed := range uint64(20) {
		m := memDir(t)
		m.SetSyncError(errors.New("disk gone"))
		if _, err := Load(m, "/data", nil); err == nil {
			t.Fatal("Load succeeded with failing syncs")
		}
		img := m.Crash(rand.New(rand.NewPCG(seed, 2)), true)
		if _, err := Load(img, "/data", nil); err != nil {
			t.Fatalf("seed %d: Load after a crash during creation: %v", seed, err)
		}
	}
}

// TestMovedDataDirKeepsID: the id lives in the data directory, so a
// directory moved (here: renamed on the real file system) keeps it.
func TestMovedDataDirKeepsID(t *testing.T) {
	root := t.TempDir()
	from, to := filepath.Join(root, "host-a"), filepath.Join(root, "host-b")
	if err := os.Mkdir(from, 0o755); err != nil {
		t.Fatal(err)
	}
	id, err := Load(vfs.OS(), from, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
	got, err := Load(vfs.OS(), to, errReader{})
	if err != nil || got != id {
		t.Fatalf("moved directory: %q, %v; want %q", got, err, id)
	}
}

// TestDamageIsRefused: every single flipped bit, every truncation and an
// oversized file are ErrCorrupt, and Load does not replace the file.
func TestDamageIsRefused(t *testing.T) {
	m := memDir(t)
	if _, err := Load(m, "/data", nil); err != nil {
		t.Fatal(err)
	}
	name := "/data/" + FileName
	good, err := m.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, b []byte) {
		t.Helper()
		if err := m.WriteFile(name, b); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(m, "/data", nil); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Load = %v, want ErrCorrupt", what, err)
		}
		if after, _ := m.ReadFile(name); !bytes.Equal(after, b) {
			t.Errorf("%s: Load rewrote the damaged file", what)
		}
	}
	for i := range len(good) * 8 {
		b := bytes.Clone(good)
		b[i/8] ^= 1 << (i % 8)
		check("bit flip", b)
	}
	for n := range len(good) {
		check("truncated", good[:n])
	}
	check("oversized", bytes.Repeat([]byte("x"), fileBytesMax+1))
	check("other version", bytes.Replace(good, []byte(" 1 "), []byte(" 2 "), 1))
}

func FuzzParse(f *testing.F) {
	f.Add(format("0123456789abcdef0123456789abcdef"))
	f.Add([]byte("sinew-node-id 1 x y\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := parse(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if !bytes.Equal(format(id), b) {
			t.Fatalf("accepted %q, which is not the canonical form of %q", b, id)
		}
	})
}
