package tlsconf

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Generate with peer node ids: a peer CA apart from the client CA, and a
// certificate per node that chains to it (not to the client CA), carries
// both usages and names its node.
func TestGeneratePeers(t *testing.T) {
	dir := t.TempDir()
	ids := []string{"n1", "n2"}
	g, err := Generate(GenerateOptions{Dir: dir, Days: 1, Now: time.Now(), PeerNodeIDs: ids, PeerCluster: "sinew"})
	if err != nil {
		t.Fatal(err)
	}
	pool := func(path string) *x509.CertPool {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		p := x509.NewCertPool()
		if !p.AppendCertsFromPEM(b) {
			t.Fatalf("%s: no certificate", path)
		}
		return p
	}
	peerRoots, clientRoots := pool(g.PeerCA), pool(g.CA)
	if len(g.Peers) != 2 {
		t.Fatalf("peers %+v", g.Peers)
	}
	for i, p := range g.Peers {
		b, err := os.ReadFile(p.Cert)
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if id, err := PeerNodeID(c, "sinew"); err != nil || id != ids[i] || p.NodeID != ids[i] {
			t.Fatalf("%s names %q, %v", p.Cert, id, err)
		}
		if !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
			t.Fatalf("usages %v", c.ExtKeyUsage)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: peerRoots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Fatalf("does not chain to the peer CA: %v", err)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: clientRoots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err == nil {
			t.Fatal("a peer certificate chains to the client CA")
		}
		if filepath.Base(p.Key) != PeerKeyFile(ids[i]) {
			t.Fatalf("key %s", p.Key)
		}
	}
	for _, o := range []GenerateOptions{
		{PeerNodeIDs: []string{"a/b"}, PeerCluster: "sinew"},
		{PeerNodeIDs: []string{""}, PeerCluster: "sinew"},
		{PeerNodeIDs: []string{"a", "a"}, PeerCluster: "sinew"},
		{PeerNodeIDs: []string{"a"}},
	} {
		o.Dir, o.Days, o.Now = t.TempDir(), 1, time.Now()
		if _, err := Generate(o); err == nil {
			t.Errorf("%+v: no error", o.PeerNodeIDs)
		} else if strings.Contains(err.Error(), "panic") {
			t.Errorf("%v", err)
		}
	}
}
