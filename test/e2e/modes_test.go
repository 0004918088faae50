package e2e_test

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sinewmq/sinew"
)

// TestDataDirIsPrivateUnderUmask022 runs the real binary under a umask of
// 022 (the usual default, which leaves new files world-readable) and checks
// that nothing under its data dir is readable by other local users: after
// publishing, consuming, a session (with a subscription, so the session
// store writes), a runtime settings change and a clean stop, every
// directory is 0700 and every file 0600. It runs once as a single node
// (segment logs, checkpoints) and once as a one-node cluster (node id,
// controller, raft logs). Files and directories an older version left
// readable in the data dir are made private at start, with a warning; a
// file of the operator's that is not the broker's is left alone.
func TestDataDirIsPrivateUnderUmask022(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	if runtime.GOOS == "windows" {
		t.Skip("permission bits do not describe access on Windows")
	}
	bin := buildSinew(t)
	common := []string{"queues", "sessions", "runtime-settings.json", "owner-id", "LOCK"}
	for _, mode := range []struct {
		name  string
		extra []string
		want  []string // entries of the data dir holding files
	}{
		{"single", nil, common},
		{"cluster", []string{"--cluster", "--cluster-profile", "lan", "--cluster-gossip-listen", "127.0.0.1:0", "--cluster-peer-listen", "127.0.0.1:0"},
			append([]string{"cluster", "node_id"}, common...)},
	} {
		t.Run(mode.name, func(t *testing.T) { dataDirIsPrivate(t, bin, mode.extra, mode.want) })
	}
}

func dataDirIsPrivate(t *testing.T, bin string, extra, want []string) {
	dir := filepath.Join(t.TempDir(), "data")
	// What an older version left: world-readable (an identity, and a
	// leftover under queues/), and a file of the operator's that the
	// broker does not own and leaves as it is.
	old := filepath.Join(dir, "queues", "old")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	ownerID, oldFile, notes := filepath.Join(dir, "owner-id"), filepath.Join(old, "file"), filepath.Join(dir, "notes.txt")
	for path, data := range map[string]string{ownerID: "b-0123456789abcdef01234567\n", oldFile: "x", notes: "mine"} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chmod(path, 0o644)
	}
	for _, d := range []string{dir, filepath.Join(dir, "queues"), old} {
		os.Chmod(d, 0o755)
	}

	// exec keeps the shell's umask for the broker.
	args := append([]string{"-c", `umask 022; exec "$0" "$@"`, bin, "serve", "--data-dir", dir,
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, extra...)
	srv := startCommand(t, "sh", args...)
	admin := logField(t, srv, "msg=serving", "admin_listen")
	if !strings.Contains(srv.log(), "made them private") {
		t.Errorf("no warning about the tightened data dir:\n%s", srv.log())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*safetyTimeout)
	defer cancel()
	c, err := sinew.Dial(ctx, srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"one", "two", "three"} {
		if _, err := c.PublishText(ctx, "modes", body); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "modes")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case m := <-sub.Messages():
			if err := m.Complete(ctx); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("no delivery")
		}
	}
	settingsURL := "http://" + admin + "/api/v1/settings"
	var cur struct {
		Version uint64 `json:"version"`
	}
	getJSONInto(t, settingsURL, &cur)
	if code, body := adminDo(t, http.MethodPut, settingsURL, map[string]any{"version": cur.Version,
		"values": map[string]int64{"connection.reconnect_grace_ms": 12345}}); code != http.StatusOK {
		t.Fatalf("PUT settings: %d %s", code, body)
	}
	c.Close()
	stopChild(t, srv)

	var files, dirs int
	seen := map[string]bool{}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if path == notes {
			if fi.Mode().Perm() != 0o644 {
				t.Errorf("the operator's %s is %04o, want it left 0644", rel, fi.Mode().Perm())
			}
			return nil
		}
		switch {
		case d.IsDir():
			dirs++
			if fi.Mode().Perm() != 0o700 {
				t.Errorf("directory %s is %04o, want 0700", rel, fi.Mode().Perm())
			}
		case d.Type().IsRegular():
			files++
			seen[strings.SplitN(rel, string(filepath.Separator), 2)[0]] = true
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("file %s is %04o, want 0600", rel, fi.Mode().Perm())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk saw what the broker writes, not an empty dir.
	for _, top := range want {
		if !seen[top] {
			t.Errorf("no file under %s in the data dir (saw %v)", top, seen)
		}
	}
	t.Logf("%d directories and %d files checked: %v", dirs, files, seen)
}
