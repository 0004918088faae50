package sinew

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/tlsconf"
)

func TestLoadTLSConfig(t *testing.T) {
	dir := t.TempDir()
	g, err := tlsconf.Generate(tlsconf.GenerateOptions{Dir: dir, Days: 1, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadTLSConfig(g.CA, g.ClientCert, g.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.MinVersion < 0x0303 {
		t.Fatalf("config %+v: want the CA pool, one certificate, TLS 1.2+", cfg)
	}
	// No files at all: TLS with the system roots.
	if cfg, err := LoadTLSConfig("", "", ""); err != nil || cfg.RootCAs != nil || len(cfg.Certificates) != 0 {
		t.Fatalf("empty: %+v %v", cfg, err)
	}
	notPEM := filepath.Join(dir, "not.pem")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	for _, tc := range []struct {
		ca, cert, key, want string
	}{
		{notPEM, "", "", "no PEM certificate"},
		{filepath.Join(dir, "missing.pem"), "", "", "no such file"},
		{"", g.ClientCert, "", "both"},
		{"", g.ClientCert, g.ServerKey, "private key does not match"},
	} {
		if _, err := LoadTLSConfig(tc.ca, tc.cert, tc.key); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadTLSConfig(%q, %q, %q): %v, want an error with %q", tc.ca, tc.cert, tc.key, err, tc.want)
		}
	}
}
