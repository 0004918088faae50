//go:build unix

package vfs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// withUmask runs the test under umask mask (process-wide: these tests do
// not run in parallel) and restores the previous one.
func withUmask(t *testing.T, mask int) {
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

func permOf(t *testing.T, name string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// Whatever the umask (the common 022, a permissive 000, or one that clears
// the owner's own bits), what the OS file system creates is 0700 for
// directories and 0600 for files, whatever mode the caller asked for; a
// file opened with O_CREATE that existed with a looser mode is tightened.
func TestOSCreatesPrivateWhateverTheUmask(t *testing.T) {
	for _, mask := range []int{0o022, 0o000, 0o277} {
		t.Run(os.FileMode(mask).String(), func(t *testing.T) {
			withUmask(t, mask)
			root := t.TempDir()
			fsys := OS()
			dir := filepath.Join(root, "a", "b", "c")
			if err := fsys.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, d := range []string{filepath.Join(root, "a"), filepath.Join(root, "a", "b"), dir} {
				if p := permOf(t, d); p != DirPerm {
					t.Errorf("directory %s is %04o, want %04o", d, p, DirPerm)
				}
			}
			seg := filepath.Join(dir, "seg")
			f, err := fsys.OpenFile(seg, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if err := WriteFileAtomic(fsys, filepath.Join(dir, "ckpt"), []byte("y")); err != nil {
				t.Fatal(err)
			}
			l, err := fsys.Lock(filepath.Join(root, "LOCK"))
			if err != nil {
				t.Fatal(err)
			}
			l.Close()
			old := filepath.Join(dir, "old")
			if err := os.WriteFile(old, []byte("z"), 0o644); err != nil {
				t.Fatal(err)
			}
			os.Chmod(old, 0o644)
			if f, err := fsys.OpenFile(old, os.O_CREATE|os.O_RDWR, 0o644); err != nil {
				t.Fatal(err)
			} else {
				f.Close()
			}
			for _, name := range []string{seg, filepath.Join(dir, "ckpt"), filepath.Join(root, "LOCK"), old} {
				if p := permOf(t, name); p != FilePerm {
					t.Errorf("file %s is %04o, want %04o", name, p, FilePerm)
				}
			}
			// Opened without O_CREATE, a file keeps its mode: reads change nothing.
			os.Chmod(old, 0o640)
			if f, err := fsys.OpenFile(old, os.O_RDONLY, 0); err != nil {
				t.Fatal(err)
			} else {
				f.Close()
			}
			if p := permOf(t, old); p != 0o640 {
				t.Errorf("read-only open changed the mode to %04o", p)
			}
		})
	}
}

// MkdirAll over a path that is a file fails, as os.MkdirAll does.
func TestOSMkdirAllOverAFile(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := OS().MkdirAll(filepath.Join(file, "sub"), 0o700); err == nil {
		t.Fatal("MkdirAll under a file succeeded")
	}
	if err := OS().MkdirAll(file, 0o700); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("MkdirAll of a file = %v, want ENOTDIR", err)
	}
}

// MakePrivate clears group and other bits on the root and the named
// entries an older version left readable, reports what it changed, leaves
// private entries, symbolic links, unnamed entries and their contents
// alone, skips named entries that do not exist, and does not follow links
// out of the tree.
func TestMakePrivate(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(outside, 0o644)
	sub := filepath.Join(root, "queues")
	os.Mkdir(sub, 0o755)
	os.Chmod(sub, 0o755)
	os.Chmod(root, 0o755)
	for name, mode := range map[string]os.FileMode{"owner-id": 0o644, "queues/seg": 0o640, "meta-ok": 0o600, "notes.txt": 0o644} {
		p := filepath.Join(root, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
	}
	if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	entries := []string{"owner-id", "queues", "meta-ok", "link", "missing"}
	changed, err := MakePrivate(root, entries)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(changed)
	want := []string{root, filepath.Join(root, "owner-id"), sub, filepath.Join(sub, "seg")}
	slices.Sort(want)
	if !slices.Equal(changed, want) {
		t.Fatalf("changed %v, want %v", changed, want)
	}
	for p, mode := range map[string]os.FileMode{root: 0o700, sub: 0o700, filepath.Join(root, "owner-id"): 0o600,
		filepath.Join(sub, "seg"): 0o600, filepath.Join(root, "meta-ok"): 0o600, outside: 0o644,
		filepath.Join(root, "notes.txt"): 0o644} {
		if got := permOf(t, p); got != mode {
			t.Errorf("%s is %04o, want %04o", p, got, mode)
		}
	}
	if again, err := MakePrivate(root, entries); err != nil || len(again) != 0 {
		t.Fatalf("second pass changed %v, %v", again, err)
	}
}

// CheckPrivate refuses a secret any group or other bit grants access to,
// naming the fix, and accepts 0600 and 0400.
func TestCheckPrivate(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(key, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o600, 0o400} {
		os.Chmod(key, mode)
		if err := CheckPrivate(OS(), key); err != nil {
			t.Errorf("mode %04o: %v", mode, err)
		}
	}
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o610} {
		os.Chmod(key, mode)
		err := CheckPrivate(OS(), key)
		if !errors.Is(err, ErrNotPrivate) || !strings.Contains(err.Error(), "chmod 600 "+key) {
			t.Errorf("mode %04o: %v, want ErrNotPrivate naming chmod 600 %s", mode, err, key)
		}
	}
	if err := CheckPrivate(OS(), filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}
