//go:build unix

package clusternode

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/settings"
	"github.com/sinewmq/sinew/internal/tlsconf"
	"github.com/sinewmq/sinew/internal/vfs"
)

// A gossip key file others may read is refused, naming the setting, the
// file and the fix; 0600 and 0400 are accepted.
func TestGossipKeyReadableByOthersIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o644, 0o640} {
		os.Chmod(path, mode)
		if _, err := readGossipKey(path); !errors.Is(err, vfs.ErrNotPrivate) {
			t.Fatalf("mode %04o: %v, want ErrNotPrivate", mode, err)
		}
	}
	os.Chmod(path, 0o644)
	_, err := readGossipKey(path)
	if want := "cluster.gossip_key_file " + path + ": readable by group or others (mode 0644): run chmod 600 " + path; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	for _, mode := range []os.FileMode{0o600, 0o400} {
		os.Chmod(path, mode)
		if key, err := readGossipKey(path); err != nil || len(key) != 16 {
			t.Fatalf("mode %04o: %d bytes, %v", mode, len(key), err)
		}
	}
}

// The same for the raft transport's private key: what sinew cert generate
// writes passes, and made readable by others it is refused.
func TestPeerTLSKeyReadableByOthersIsRefused(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef"
	g, err := tlsconf.Generate(tlsconf.GenerateOptions{Dir: t.TempDir(), Days: 1, Now: time.Now(),
		PeerNodeIDs: []string{id}, PeerCluster: RaftClusterID})
	if err != nil {
		t.Fatal(err)
	}
	peer := g.Peers[0]
	c := settings.Config{Cluster: settings.Cluster{PeerTLSCertFile: peer.Cert, PeerTLSKeyFile: peer.Key, PeerTLSCAFile: g.PeerCA}}
	if _, err := LoadPeerTLS(c, id); err != nil {
		t.Fatalf("generated files: %v", err)
	}
	os.Chmod(peer.Key, 0o644)
	_, err = LoadPeerTLS(c, id)
	if want := "cluster.peer_tls_key_file " + peer.Key + ": readable by group or others (mode 0644): run chmod 600 " + peer.Key; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}
