package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/clusternode"
	"github.com/sinewmq/sinew/internal/nodeid"
	"github.com/sinewmq/sinew/internal/settings"
	"github.com/sinewmq/sinew/internal/tlsconf"
	"github.com/sinewmq/sinew/internal/vfs"
)

// sinew cert generate --peer-data-dirs makes the data directories' node
// ids, a peer CA apart from the client CA and one peer certificate per
// node that clusternode.LoadPeerTLS takes for that node and refuses for another; bad
// input is a usage error.
func TestCLICertGeneratePeers(t *testing.T) {
	base := t.TempDir()
	certs := filepath.Join(base, "certs")
	d1, d2 := filepath.Join(base, "d1"), filepath.Join(base, "d2")
	code, out, errOut := runCmd(t, "", "cert", "generate", "--dir", certs, "--peer-data-dirs", d1+","+d2)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var ids []string
	for _, d := range []string{d1, d2} {
		id, err := nodeid.Load(vfs.OS(), d, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		for _, name := range []string{tlsconf.PeerCertFile(id), tlsconf.PeerKeyFile(id), tlsconf.PeerCAFile} {
			fi, err := os.Stat(filepath.Join(certs, name))
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("%s: %v, want a 0600 file", name, err)
			}
		}
		if !strings.Contains(out, "--cluster-peer-tls-cert-file "+filepath.Join(certs, tlsconf.PeerCertFile(id))) {
			t.Errorf("the output does not name %s's certificate:\n%s", id, out)
		}
	}
	peerCA, _ := os.ReadFile(filepath.Join(certs, tlsconf.PeerCAFile))
	clientCA, _ := os.ReadFile(filepath.Join(certs, tlsconf.CAFile))
	if bytes.Equal(peerCA, clientCA) {
		t.Fatal("the peer CA is the client CA")
	}
	// The whole output still loads as a configuration (the peer lines are
	// comments: each node has its own).
	toml := filepath.Join(base, "sinew.toml")
	if err := os.WriteFile(toml, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := settings.Load(settings.Sources{File: toml}); err != nil {
		t.Fatalf("the output does not load: %v\n%s", err, out)
	}

	cfg := settings.Default()
	cfg.DataDir = d1
	cfg.Cluster.PeerTLSCertFile = filepath.Join(certs, tlsconf.PeerCertFile(ids[0]))
	cfg.Cluster.PeerTLSKeyFile = filepath.Join(certs, tlsconf.PeerKeyFile(ids[0]))
	cfg.Cluster.PeerTLSCAFile = filepath.Join(certs, tlsconf.PeerCAFile)
	p, err := clusternode.LoadPeerTLS(cfg, ids[0])
	if err != nil || p.RaftID == nil {
		t.Fatalf("node 1's own certificate: %v", err)
	}
	_, err = clusternode.LoadPeerTLS(cfg, ids[1])
	if err == nil || !strings.Contains(err.Error(), "it names node "+ids[0]) || !strings.Contains(err.Error(), "sinew-node://sinew/"+ids[1]) {
		t.Fatalf("node 1's certificate for node 2: %v", err)
	}
	cfg.Cluster.PeerTLSCertFile, cfg.Cluster.PeerTLSKeyFile = filepath.Join(certs, tlsconf.ClientCertFile), filepath.Join(certs, tlsconf.ClientKeyFile)
	if _, err := clusternode.LoadPeerTLS(cfg, ids[0]); err == nil || !strings.Contains(err.Error(), "names no node") || !strings.Contains(err.Error(), "--peer-data-dirs") {
		t.Fatalf("the client certificate as a peer's: %v", err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--peer-ids", "abc"}, "a node id is 32 lowercase hex digits"},
		{[]string{"--peer-ids", ids[0] + "," + ids[0]}, "named twice"},
		{[]string{"--peer-ids", ids[0], "--peer-data-dirs", d1}, "give one of them"},
		{[]string{"--peer-data-dirs", d1 + "," + d1}, "hold the same node id"},
		{[]string{"--peer-ids", strings.ToUpper(ids[0])}, "lowercase hex"},
		{[]string{"stray"}, "unexpected argument"},
	} {
		code, _, errOut := runCmd(t, "", append([]string{"cert", "generate", "--dir", filepath.Join(t.TempDir(), "c")}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "panic") {
			t.Errorf("%v: exit %d %q, want a refusal saying %q", tc.args, code, errOut, tc.want)
		}
	}
	if code, _, errOut := runCmd(t, "", "cert", "generate", "--dir", certs, "--peer-ids", ids[1]); code == 0 || !strings.Contains(errOut, "--force") {
		t.Errorf("over existing files: exit %d %q", code, errOut)
	}
	for _, args := range [][]string{{"cert", "--help"}, {"cert", "generate", "--help"}} {
		if code, _, errOut := runCmd(t, "", args...); code != 0 || !strings.Contains(errOut, "--peer-data-dirs") || !strings.Contains(errOut, "sinew-node://sinew/<node id>") {
			t.Errorf("%v: exit %d %s", args, code, errOut)
		}
	}
}
