package tlsconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sinewmq/sinew/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// certSet is a generated directory plus its client-side pool.
type certSet struct {
	gen  Generated
	pool *x509.CertPool
}

func generate(t testing.TB, dir string, force bool) certSet {
	t.Helper()
	g, err := Generate(GenerateOptions{Dir: dir, Days: 1, Now: time.Now(), Force: force})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	b, err := os.ReadFile(g.CA)
	if err != nil || !pool.AppendCertsFromPEM(b) {
		t.Fatalf("ca %s: %v", g.CA, err)
	}
	return certSet{gen: g, pool: pool}
}

func (s certSet) clientCert(t testing.TB) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(s.gen.ClientCert, s.gen.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// echoServer serves a Listener on loopback: each connection's bytes come
// back, and the server-side *Conn goes to conns once it handshook.
type echoServer struct {
	ln    *Listener
	conns chan *Conn
	errs  chan error
	wg    sync.WaitGroup
}

func startEcho(t *testing.T, r *Reloader, o ListenerOptions) *echoServer {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: NewListener(inner, r.ServerConfig(), o), conns: make(chan *Conn, 16), errs: make(chan error, 16)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			nc, err := s.ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer nc.Close()
				c := nc.(*Conn)
				nc.SetDeadline(time.Now().Add(10 * time.Second))
				if err := c.Handshake(); err != nil {
					s.errs <- err
					return
				}
				s.conns <- c
				io.Copy(nc, nc)
			}()
		}
	}()
	t.Cleanup(func() { s.ln.Close(); s.wg.Wait() })
	return s
}

func (s *echoServer) addr() string { return s.ln.Addr().String() }

func newReloader(t *testing.T, f Files, o Options) *Reloader {
	t.Helper()
	r, err := NewReloader(f, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func serverFiles(s certSet) Files { return Files{CertFile: s.gen.ServerCert, KeyFile: s.gen.ServerKey} }

// roundTrip dials with cfg and echoes one message; it returns the
// connection open (the caller closes it) or the dial error.
func roundTrip(t *testing.T, addr string, cfg *tls.Config) (*tls.Conn, error) {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := echo(c, "hello"); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func echo(c net.Conn, msg string) error {
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if string(got) != msg {
		return errors.New("echo mismatch: " + string(got))
	}
	return nil
}

func TestTLSSucceedsAndIsAtLeast12(t *testing.T) {
	s := generate(t, t.TempDir(), false)
	srv := startEcho(t, newReloader(t, serverFiles(s), Options{}), ListenerOptions{})
	c, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: s.pool, ServerName: "localhost"})
	if err != nil {
		t.Fatalf("TLS: %v", err)
	}
	if v := c.ConnectionState().Version; v < tls.VersionTLS12 {
		t.Fatalf("version %x below TLS 1.2", v)
	}
	c.Close()
	// 127.0.0.1 is a SAN too.
	c, err = roundTrip(t, srv.addr(), &tls.Config{RootCAs: s.pool})
	if err != nil {
		t.Fatalf("TLS by IP: %v", err)
	}
	c.Close()
	// A client that offers only TLS 1.1 is refused.
	if _, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: s.pool, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}); err == nil {
		t.Fatal("TLS 1.1 client accepted")
	}
	if err := <-srv.errs; err == nil {
		t.Fatal("server handshake with a TLS 1.1 client succeeded")
	}
}

func TestMutualTLSAndCertUser(t *testing.T) {
	s := generate(t, t.TempDir(), false)
	f := serverFiles(s)
	f.ClientCAFile = s.gen.CA // client_auth defaults to require
	for _, tc := range []struct {
		mode CertUser
		want string
	}{{CertUserCN, "sinew-client"}, {CertUserSAN, "sinew-client"}, {CertUserOff, ""}} {
		srv := startEcho(t, newReloader(t, f, Options{}), ListenerOptions{CertUser: tc.mode})
		c, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: s.pool, ServerName: "localhost", Certificates: []tls.Certificate{s.clientCert(t)}})
		if err != nil {
			t.Fatalf("mTLS (%q): %v", tc.mode, err)
		}
		sc := <-srv.conns
		if got := sc.PeerCertName(); got != tc.want {
			t.Fatalf("mode %q: PeerCertName %q, want %q", tc.mode, got, tc.want)
		}
		c.Close()
	}
	// Required and missing: the handshake fails on the server.
	srv := startEcho(t, newReloader(t, f, Options{}), ListenerOptions{CertUser: CertUserCN})
	if _, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: s.pool, ServerName: "localhost"}); err == nil {
		t.Fatal("client without a certificate accepted under client_auth=require")
	}
	if err := <-srv.errs; err == nil {
		t.Fatal("server handshake succeeded without a client certificate")
	}
	// verify_if_given: no certificate is fine, and names nobody.
	f.ClientAuth = ClientAuthVerifyIfGiven
	srv = startEcho(t, newReloader(t, f, Options{}), ListenerOptions{CertUser: CertUserCN})
	c, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: s.pool, ServerName: "localhost"})
	if err != nil {
		t.Fatalf("verify_if_given without a certificate: %v", err)
	}
	if got := (<-srv.conns).PeerCertName(); got != "" {
		t.Fatalf("PeerCertName %q without a certificate", got)
	}
	c.Close()
}

func TestWrongCAFailsBothWays(t *testing.T) {
	good := generate(t, t.TempDir(), false)
	other := generate(t, t.TempDir(), false)
	f := serverFiles(good)
	f.ClientCAFile = good.gen.CA
	srv := startEcho(t, newReloader(t, f, Options{}), ListenerOptions{})

	// The client trusts another CA: it rejects the server.
	_, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: other.pool, ServerName: "localhost", Certificates: []tls.Certificate{good.clientCert(t)}})
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("client with the wrong CA: %v, want x509.UnknownAuthorityError", err)
	}
	<-srv.errs
	// The client's certificate comes from another CA: the server rejects it.
	_, err = roundTrip(t, srv.addr(), &tls.Config{RootCAs: good.pool, ServerName: "localhost", Certificates: []tls.Certificate{other.clientCert(t)}})
	if err == nil {
		t.Fatal("client certificate from an unknown CA accepted")
	}
	if serr := <-srv.errs; !errors.As(serr, &unknown) {
		t.Fatalf("server error %v, want x509.UnknownAuthorityError", serr)
	}
	// Both refusals were counted; a peer that closes without a byte is not.
	probe, err := net.Dial("tcp", srv.addr())
	if err != nil {
		t.Fatal(err)
	}
	probe.Close()
	if err := <-srv.errs; !errors.Is(err, io.EOF) {
		t.Fatalf("probe: %v, want EOF", err)
	}
	if st := srv.ln.Stats(); st.Failed != 2 || st.Plaintext != 0 {
		t.Fatalf("listener stats %+v, want 2 failed handshakes", st)
	}
}

func TestExpiredCertificatesFail(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := NewIssuer("test CA", now.Add(-48*time.Hour), now.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	expired := Leaf{NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)}
	valid := Leaf{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}

	// An expired server certificate: the client refuses it.
	l := expired
	l.CommonName, l.Hosts, l.Server = "srv", []string{"localhost"}, true
	cp, kp, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	srv := startEcho(t, newReloader(t, Files{CertFile: write("old.pem", cp), KeyFile: write("old-key.pem", kp)}, Options{Logger: logger}), ListenerOptions{})
	if !strings.Contains(logs.String(), "tls certificate has expired") {
		t.Fatalf("loading an expired certificate logged %q, want a warning", logs.String())
	}
	_, err = roundTrip(t, srv.addr(), &tls.Config{RootCAs: pool, ServerName: "localhost"})
	var invalid x509.CertificateInvalidError
	if !errors.As(err, &invalid) || invalid.Reason != x509.Expired {
		t.Fatalf("expired server certificate: %v, want x509 Expired", err)
	}
	<-srv.errs

	// An expired client certificate: the server refuses it.
	l = valid
	l.CommonName, l.Hosts, l.Server = "srv", []string{"localhost"}, true
	cp, kp, _ = ca.Issue(l)
	f := Files{CertFile: write("srv.pem", cp), KeyFile: write("srv-key.pem", kp), ClientCAFile: write("ca.pem", ca.CertPEM)}
	l = expired
	l.CommonName, l.Client = "cli", true
	ccp, ckp, _ := ca.Issue(l)
	cliCert, err := tls.X509KeyPair(ccp, ckp)
	if err != nil {
		t.Fatal(err)
	}
	srv = startEcho(t, newReloader(t, f, Options{}), ListenerOptions{})
	if _, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{cliCert}}); err == nil {
		t.Fatal("expired client certificate accepted")
	}
	if serr := <-srv.errs; !errors.As(serr, &invalid) || invalid.Reason != x509.Expired {
		t.Fatalf("server error %v, want x509 Expired", serr)
	}

	// A valid client certificate is refused once the server's clock
	// (Options.Time) is past its NotAfter.
	l = valid
	l.CommonName, l.Client = "cli", true
	ccp, ckp, _ = ca.Issue(l)
	cliCert, _ = tls.X509KeyPair(ccp, ckp)
	later := func() time.Time { return now.Add(2 * time.Hour) }
	srv = startEcho(t, newReloader(t, f, Options{Time: later}), ListenerOptions{})
	if _, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{cliCert}}); err == nil {
		t.Fatal("client certificate accepted after its NotAfter on the server's clock")
	}
	if serr := <-srv.errs; !errors.As(serr, &invalid) || invalid.Reason != x509.Expired {
		t.Fatalf("server error %v, want x509 Expired", serr)
	}
}

// leafSerial is the serial of the certificate the server presented.
func leafSerial(c *tls.Conn) string {
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func TestReloadKeepsConnectionsAndServesNewCertificate(t *testing.T) {
	dir := t.TempDir()
	first := generate(t, dir, false)
	r := newReloader(t, serverFiles(first), Options{})
	srv := startEcho(t, r, ListenerOptions{})
	old, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: first.pool, ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	oldSerial := leafSerial(old)

	// Nothing changed: the watcher does not reload.
	if tried, err := r.ReloadIfChanged(); tried || err != nil {
		t.Fatalf("unchanged files: tried %v, err %v", tried, err)
	}

	// Rotate: new files in place, picked up by the watcher's tick.
	second := generate(t, dir, true)
	ctx, cancel := context.WithCancel(context.Background())
	tick := make(chan time.Time)
	done := make(chan struct{})
	go func() { r.Watch(ctx, tick); close(done) }()
	tick <- time.Now()
	tick <- time.Now() // the second send waits until the first tick's reload ran
	cancel()
	<-done
	if st := r.Stats(); st.Reloads != 1 || st.Failures != 0 {
		t.Fatalf("stats after rotation %+v, want 1 reload", st)
	}

	// The connection made before the reload carries on.
	if err := echo(old, "still here"); err != nil {
		t.Fatalf("existing connection after reload: %v", err)
	}
	// A new connection gets the new certificate: the new CA verifies it and
	// the old one no longer does.
	nc, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: second.pool, ServerName: "localhost"})
	if err != nil {
		t.Fatalf("new connection after reload: %v", err)
	}
	if leafSerial(nc) == oldSerial {
		t.Fatal("new connection got the old certificate")
	}
	nc.Close()
	if _, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: first.pool, ServerName: "localhost"}); err == nil {
		t.Fatal("old CA still verifies the server after rotation")
	}
	<-srv.errs
}

func TestFailedReloadKeepsOldCertificate(t *testing.T) {
	dir := t.TempDir()
	s := generate(t, dir, false)
	r := newReloader(t, serverFiles(s), Options{})
	srv := startEcho(t, r, ListenerOptions{})

	// A key that does not match the certificate.
	other := generate(t, t.TempDir(), false)
	key, _ := os.ReadFile(other.gen.ServerKey)
	if err := os.WriteFile(s.gen.ServerKey, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if tried, err := r.ReloadIfChanged(); !tried || err == nil {
		t.Fatalf("mismatched key: tried %v, err %v; want a failed reload", tried, err)
	}
	// Unchanged broken files are not tried again.
	if tried, _ := r.ReloadIfChanged(); tried {
		t.Fatal("broken files retried without a change")
	}
	// SIGHUP's path (Reload) tries regardless, and fails again.
	if err := r.Reload(); err == nil {
		t.Fatal("Reload of a mismatched key succeeded")
	}
	if st := r.Stats(); st.Reloads != 0 || st.Failures != 2 {
		t.Fatalf("stats %+v, want 0 reloads, 2 failures", st)
	}
	c, err := roundTrip(t, srv.addr(), &tls.Config{RootCAs: s.pool, ServerName: "localhost"})
	if err != nil {
		t.Fatalf("old certificate no longer served after a failed reload: %v", err)
	}
	c.Close()

	// A broken file at startup is refused outright.
	if _, err := NewReloader(serverFiles(s), Options{}); err == nil {
		t.Fatal("NewReloader accepted a mismatched key")
	}
	if _, err := NewReloader(Files{CertFile: s.gen.ServerCert, KeyFile: filepath.Join(dir, "missing.pem")}, Options{}); err == nil {
		t.Fatal("NewReloader accepted a missing key file")
	}
}

func TestPlaintextSinewClientGetsClearError(t *testing.T) {
	s := generate(t, t.TempDir(), false)
	srv := startEcho(t, newReloader(t, serverFiles(s), Options{}), ListenerOptions{})
	c, err := net.Dial("tcp", srv.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	hello := protocol.AppendFrame(nil, 0, 42, &protocol.Hello{ProtocolVersion: protocol.Version, ClientName: "plain"})
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	f, _, err := protocol.ReadFrame(c, protocol.FrameBytesDefault, nil)
	if err != nil {
		t.Fatalf("reading the answer to a plaintext HELLO: %v", err)
	}
	body, err := protocol.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	eb, ok := body.(*protocol.ErrorBody)
	if !ok || eb.Code != protocol.CodeBadRequest || eb.Message != PlaintextOnTLSMessage || f.RequestID != 42 {
		t.Fatalf("answer %T %+v (request %d), want ERROR bad_request %q for request 42", body, body, f.RequestID, PlaintextOnTLSMessage)
	}
	if err := <-srv.errs; !errors.Is(err, ErrPlaintext) {
		t.Fatalf("server side: %v, want ErrPlaintext", err)
	}
	if st := srv.ln.Stats(); st.Plaintext != 1 || st.Failed != 0 {
		t.Fatalf("listener stats %+v, want 1 plaintext", st)
	}
	// Then the server closes.
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection still open after the plaintext error")
	}
}

func TestGenerateFilesAndRefusal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	g, err := Generate(GenerateOptions{Dir: dir, Days: 30, Hosts: []string{"broker.example", "10.0.0.5"}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{g.CA, g.ServerCert, g.ServerKey, g.ClientCert, g.ClientKey} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
	pair, err := tls.LoadX509KeyPair(g.ServerCert, g.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf := pair.Leaf
	for _, h := range []string{"localhost", "127.0.0.1", "::1", "broker.example", "10.0.0.5"} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Fatalf("server certificate does not name %s: %v", h, err)
		}
	}
	if d := leaf.NotAfter.Sub(time.Now()); d < 29*24*time.Hour || d > 31*24*time.Hour {
		t.Fatalf("NotAfter %v is not 30 days out", leaf.NotAfter)
	}
	before, _ := os.ReadFile(g.ServerKey)
	if _, err := Generate(GenerateOptions{Dir: dir, Days: 30, Now: time.Now()}); !errors.Is(err, ErrExists) {
		t.Fatalf("second Generate: %v, want ErrExists", err)
	}
	if after, _ := os.ReadFile(g.ServerKey); !bytes.Equal(before, after) {
		t.Fatal("a refused Generate changed the key")
	}
	if _, err := Generate(GenerateOptions{Dir: dir, Days: 30, Now: time.Now(), Force: true}); err != nil {
		t.Fatalf("Generate --force: %v", err)
	}
	if after, _ := os.ReadFile(g.ServerKey); bytes.Equal(before, after) {
		t.Fatal("Generate --force kept the old key")
	}
	for _, bad := range []GenerateOptions{{Dir: dir, Days: 0, Force: true}, {Dir: dir, Days: 1, Hosts: []string{"a b"}, Force: true}} {
		if _, err := Generate(bad); err == nil {
			t.Fatalf("Generate(%+v) accepted", bad)
		}
	}
}
