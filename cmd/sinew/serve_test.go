package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/settings"
)

// selfSigned writes a fresh self-signed ECDSA certificate for 127.0.0.1 and its
// key as PEM files and returns their paths and a pool that trusts it.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sinew test"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// runServeT runs serve in the background and returns its client address; the
// returned stop drains it and returns serve's error.
func runServeT(t *testing.T, cfg settings.Config) (addr string, stop func() error) {
	t.Helper()
	ready := make(chan string, 1)
	serveReadyHook = func(client, _ string) { ready <- client }
	t.Cleanup(func() { serveReadyHook = nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	select {
	case addr = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v", err)
	case <-timeout.C:
		cancel()
		t.Fatal("serve did not start")
	}
	var stopped bool
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { stop() })
	return addr, stop
}

func testServeConfig(t *testing.T) settings.Config {
	cfg := settings.Default()
	cfg.Listen, cfg.AdminListen, cfg.DataDir = "127.0.0.1:0", "", t.TempDir()
	return cfg
}

func TestServeTLS(t *testing.T) {
	cfg := testServeConfig(t)
	var pool *x509.CertPool
	cfg.TLS.CertFile, cfg.TLS.KeyFile, pool = selfSigned(t)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	addr, stop := runServeT(t, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := sinew.Dial(ctx, addr, sinew.WithTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatalf("dial over TLS: %v", err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, "tls-jobs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishText(ctx, "tls-jobs", "secret"); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-sub.Messages():
		if m.Text() != "secret" {
			t.Fatalf("got %q", m.Text())
		}
		if err := m.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("no message over TLS")
	}

	// A client that does not trust the certificate is refused by its own check;
	// a plain-TCP client gets no HELLO_OK.
	if _, err := sinew.Dial(ctx, addr, sinew.WithTLS(&tls.Config{MinVersion: tls.VersionTLS12}),
		sinew.WithReconnect(sinew.ReconnectPolicy{MaxAttempts: 1})); err == nil {
		t.Fatal("dial with an untrusted certificate succeeded")
	}
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	defer pcancel()
	if _, err := sinew.Dial(pctx, addr, sinew.WithReconnect(sinew.ReconnectPolicy{MaxAttempts: 1})); err == nil {
		t.Fatal("plain TCP dial of a TLS listener succeeded")
	}
	c.Close()
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
}

func TestServeTLSBadFiles(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.TLS.CertFile, cfg.TLS.KeyFile = filepath.Join(t.TempDir(), "missing.pem"), filepath.Join(t.TempDir(), "missing-key.pem")
	err := serve(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "tls.cert_file") || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("serve with missing TLS files: %v", err)
	}
}

// dirSnapshot describes every file under dir except the lock file: name,
// size, modification time and contents.
func dirSnapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "LOCK" {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[p] = fmt.Sprintf("%d %s %x", fi.Size(), fi.ModTime().Format(time.RFC3339Nano), sha256.Sum256(data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// appendTornTail appends bytes that recovery treats as a torn write to the
// end of every log segment under dir.
func appendTornTail(t *testing.T, dir string) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "queues", "*", "*", "p*", "log", "*.seg"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segment under %s (%v)", dir, err)
	}
	for _, name := range segs {
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.Write([]byte{0xde, 0xad, 0xbe})
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestServeLockedDirOrTakenPortFailsBeforeRecovery: a serve that cannot
// own its data dir, or cannot bind a port, fails without changing a byte of
// the data dir, and leaves the dir free for the next serve.
func TestServeLockedDirOrTakenPortFailsBeforeRecovery(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.Storage.Quarantine = "ignore"
	addr, stop := runServeT(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := sinew.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := c.PublishText(ctx, "jobs", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()

	// While the first serve runs, a second one on its dir is refused.
	err = serve(context.Background(), cfg, slog.New(slog.DiscardHandler))
	var le *broker.DataDirLockedError
	if !errors.As(err, &le) || le.PID != os.Getpid() {
		t.Fatalf("second serve on a live data dir: %v; want a lock error naming pid %d", err, os.Getpid())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// A torn tail, which any recovery cuts off: if a failed serve ran
	// recovery, the log file would change.
	appendTornTail(t, cfg.DataDir)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	before := dirSnapshot(t, cfg.DataDir)
	for _, c := range []struct{ name, listen, admin, want string }{
		{"client port", taken.Addr().String(), "", "listen: "},
		{"admin port", "127.0.0.1:0", taken.Addr().String(), "admin listen: "},
	} {
		bad := cfg
		bad.Listen, bad.AdminListen = c.listen, c.admin
		err := serve(context.Background(), bad, slog.New(slog.DiscardHandler))
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Fatalf("%s taken: serve = %v, want an error starting %q", c.name, err, c.want)
		}
		if after := dirSnapshot(t, cfg.DataDir); !maps.Equal(before, after) {
			t.Fatalf("%s taken: data dir changed\nbefore %v\nafter  %v", c.name, before, after)
		}
	}
	// The control: a serve that does run recovery cuts the torn tail, so
	// the comparison above can fail.
	addr, stop = runServeT(t, cfg)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if after := dirSnapshot(t, cfg.DataDir); maps.Equal(before, after) {
		t.Fatal("a full serve left the data dir byte-identical; the snapshot sees nothing")
	}
}
