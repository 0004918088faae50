package clusternode

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/settings"
	"github.com/sinewmq/sinew/internal/tlsconf"
)

// CheckAuth: a clustered node with users or tokens needs the gossip
// key and peer TLS; the message names what is missing.
func TestCheckClusterAuth(t *testing.T) {
	cfg := settings.Default()
	if err := CheckAuth(cfg, true); err != nil {
		t.Fatalf("no cluster: %v", err)
	}
	cfg.Cluster.Enabled = true
	if err := CheckAuth(cfg, false); err != nil {
		t.Fatalf("the anonymous quick start: %v", err)
	}
	err := CheckAuth(cfg, true)
	if err == nil || !strings.Contains(err.Error(), "users are configured") || !strings.Contains(err.Error(), "cluster.gossip_key_file") ||
		!strings.Contains(err.Error(), "cluster.peer_tls_cert_file") {
		t.Fatalf("users: %v", err)
	}
	cfg.Auth.Tokens = []string{"t"}
	cfg.Cluster.GossipKeyFile = "k"
	err = CheckAuth(cfg, false)
	if err == nil || !strings.Contains(err.Error(), "auth.tokens are configured") || strings.Contains(err.Error(), "missing cluster.gossip_key_file") ||
		!strings.Contains(err.Error(), "cluster.peer_tls_cert_file") {
		t.Fatalf("tokens with a key: %v", err)
	}
	cfg.Cluster.PeerTLSCertFile = "c"
	if err := CheckAuth(cfg, true); err != nil {
		t.Fatalf("both: %v", err)
	}
}

// warnSharedPeerCA warns when a client CA is also in the peer CA file,
// naming both settings, and not when they differ.
func TestWarnSharedPeerCA(t *testing.T) {
	dir := t.TempDir()
	g, err := tlsconf.Generate(tlsconf.GenerateOptions{Dir: dir, Days: 1, Now: time.Now(),
		PeerNodeIDs: []string{"0123456789abcdef0123456789abcdef"}, PeerCluster: RaftClusterID})
	if err != nil {
		t.Fatal(err)
	}
	warned := func(cfg settings.Config) string {
		var b bytes.Buffer
		warnSharedPeerCA(cfg, slog.New(slog.NewTextHandler(&b, nil)))
		return b.String()
	}
	cfg := settings.Default()
	cfg.Cluster.PeerTLSCAFile = g.PeerCA
	cfg.TLS.ClientCAFile = g.CA
	if s := warned(cfg); s != "" {
		t.Fatalf("separate CAs: %s", s)
	}
	bundle := filepath.Join(dir, "bundle.pem")
	a, _ := os.ReadFile(g.PeerCA)
	b, _ := os.ReadFile(g.CA)
	if err := os.WriteFile(bundle, append(a, b...), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Cluster.PeerTLSCAFile = bundle
	s := warned(cfg)
	if !strings.Contains(s, "the peer CA is also a client CA") || !strings.Contains(s, "cluster.peer_tls_ca_file="+bundle) || !strings.Contains(s, "tls.client_ca_file="+g.CA) {
		t.Fatalf("a shared CA: %q", s)
	}
	cfg.TLS.ClientCAFile, cfg.AdminTLS.ClientCAFile = "", g.CA
	if s := warned(cfg); !strings.Contains(s, "admin_tls.client_ca_file=") {
		t.Fatalf("a shared admin CA: %q", s)
	}
}
