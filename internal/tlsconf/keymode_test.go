//go:build unix

package tlsconf

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

// A private key that group or others may read is refused at start, naming
// the setting, the file and the fix; a reload to such a key fails and keeps
// the old material. What Generate writes (0600) passes, and so does a key
// made 0400.
func TestKeyFileReadableByOthersIsRefused(t *testing.T) {
	s := generate(t, t.TempDir(), false)
	key := s.gen.ServerKey
	r := newReloader(t, serverFiles(s), Options{})

	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := NewReloader(serverFiles(s), Options{})
	want := "tls.key_file " + key + ": readable by group or others (mode 0644): run chmod 600 " + key
	if !errors.Is(err, vfs.ErrNotPrivate) || err.Error() != want {
		t.Fatalf("NewReloader with a 0644 key: %v, want %q", err, want)
	}
	_, err = NewReloader(serverFiles(s), Options{Name: "admin_tls"})
	if err == nil || !strings.HasPrefix(err.Error(), "admin_tls.key_file ") {
		t.Fatalf("admin_tls: %v", err)
	}
	if err := r.Reload(); !errors.Is(err, vfs.ErrNotPrivate) {
		t.Fatalf("Reload with a 0644 key: %v", err)
	}
	if st := r.Stats(); st.Reloads != 0 || st.Failures != 1 {
		t.Fatalf("stats %+v, want the reload failed", st)
	}

	for _, mode := range []os.FileMode{0o600, 0o400} {
		if err := os.Chmod(key, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := NewReloader(serverFiles(s), Options{}); err != nil {
			t.Fatalf("key %04o: %v", mode, err)
		}
	}
}
