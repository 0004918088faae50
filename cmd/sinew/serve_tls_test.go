package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/settings"
	"github.com/sinewmq/sinew/internal/tlsconf"
	"github.com/sinewmq/sinew/protocol"
)

// genCerts runs the cert generate code path into dir.
func genCerts(t *testing.T, dir string, force bool) tlsconf.Generated {
	t.Helper()
	g, err := tlsconf.Generate(tlsconf.GenerateOptions{Dir: dir, Days: 1, Now: time.Now(), Force: force})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// tlsServeConfig is a test config with TLS on both listeners from g.
func tlsServeConfig(t *testing.T, g tlsconf.Generated) settings.Config {
	cfg := testServeConfig(t)
	cfg.TLS.CertFile, cfg.TLS.KeyFile = g.ServerCert, g.ServerKey
	cfg.AdminTLS.CertFile, cfg.AdminTLS.KeyFile = g.ServerCert, g.ServerKey
	return cfg
}

func clientTLS(t *testing.T, ca, cert, key string) *tls.Config {
	t.Helper()
	cfg, err := sinew.LoadTLSConfig(ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// dialOnce connects with the default policy, under which a TLS refusal is
// fatal: Dial returns it from the first attempt instead of retrying.
func dialOnce(ctx context.Context, addr string, opts ...sinew.Option) (*sinew.Client, error) {
	c, err := sinew.Dial(ctx, addr, opts...)
	if err != nil && sinew.IsRetryable(err) {
		return nil, errors.New("retryable, so not refused at once: " + err.Error())
	}
	return c, err
}

func publishOne(t *testing.T, c *sinew.Client, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()
	if _, err := c.PublishText(ctx, topic, "m"); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// httpsGet fetches url with cfg and returns the status and body.
func httpsGet(t *testing.T, url string, cfg *tls.Config) (int, string, error) {
	t.Helper()
	hc := &http.Client{Timeout: safetyTimeoutMs * time.Millisecond, Transport: &http.Transport{TLSClientConfig: cfg}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// Mutual TLS end to end on both listeners: a client with a certificate from
// the client CA publishes; one without a certificate, or trusting another
// CA, is refused at once; a plaintext client gets the clear bad_request; the
// admin API answers over HTTPS to a client with a certificate, and a
// plaintext HTTP request gets a 400 saying HTTPS.
func TestServeMutualTLSBothListeners(t *testing.T) {
	g := genCerts(t, t.TempDir(), false)
	other := genCerts(t, t.TempDir(), false)
	cfg := tlsServeConfig(t, g)
	cfg.TLS.ClientCAFile, cfg.AdminTLS.ClientCAFile = g.CA, g.CA
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	addr, adminAddr, stop := runServeAdmin(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()

	c, err := dialOnce(ctx, addr, sinew.WithTLS(clientTLS(t, g.CA, g.ClientCert, g.ClientKey)))
	if err != nil {
		t.Fatalf("mTLS dial: %v", err)
	}
	publishOne(t, c, "mtls")
	c.Close()

	if _, err := dialOnce(ctx, addr, sinew.WithTLS(clientTLS(t, g.CA, "", ""))); err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("client without a certificate under client_auth=require: %v", err)
	}
	_, err = dialOnce(ctx, addr, sinew.WithTLS(clientTLS(t, other.CA, g.ClientCert, g.ClientKey)))
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("client trusting another CA: %v, want x509.UnknownAuthorityError", err)
	}
	if _, err := dialOnce(ctx, addr, sinew.WithTLS(clientTLS(t, g.CA, other.ClientCert, other.ClientKey))); err == nil {
		t.Fatal("client certificate from another CA accepted")
	}

	// Plaintext on the TLS port: ERROR bad_request naming TLS, not a hang.
	_, err = dialOnce(ctx, addr)
	var be *sinew.BrokerError
	if !errors.As(err, &be) || be.Code != protocol.CodeBadRequest || !strings.Contains(be.Message, "requires TLS") {
		t.Fatalf("plaintext client on a TLS port: %v, want bad_request naming TLS", err)
	}

	// The admin API over HTTPS.
	withCert := clientTLS(t, g.CA, g.ClientCert, g.ClientKey)
	code, body, err := httpsGet(t, "https://"+adminAddr+"/healthz", withCert)
	if err != nil || code != http.StatusOK {
		t.Fatalf("admin over HTTPS: %d %q %v", code, body, err)
	}
	// Three handshakes failed (no certificate, untrusted broker, untrusted
	// client) and one peer spoke plaintext. The server may count the last
	// one a moment after the client gave up, hence the poll.
	apiPoll(t, "3 failed handshakes and 1 plaintext peer counted", func() bool {
		return httpsSample(t, adminAddr, withCert, `sinew_tls_handshake_failures_total{reason="handshake"}`) == 3 &&
			httpsSample(t, adminAddr, withCert, `sinew_tls_handshake_failures_total{reason="plaintext"}`) == 1
	})
	if _, _, err := httpsGet(t, "https://"+adminAddr+"/healthz", clientTLS(t, g.CA, "", "")); err == nil {
		t.Fatal("admin accepted a client without a certificate under admin_tls.client_auth=require")
	}
	resp, err := (&http.Client{Timeout: safetyTimeoutMs * time.Millisecond}).Get("http://" + adminAddr + "/healthz")
	if err != nil {
		t.Fatalf("plain HTTP to the admin HTTPS port: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "HTTPS") {
		t.Fatalf("plain HTTP to HTTPS: %d %q, want 400 naming HTTPS", resp.StatusCode, b)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// tlsReloadCount scrapes the admin API over HTTPS and returns
// sinew_tls_reloads_total for listener and result.
func tlsReloadCount(t *testing.T, adminAddr string, cfg *tls.Config, listener, result string) float64 {
	t.Helper()
	return httpsSample(t, adminAddr, cfg, `sinew_tls_reloads_total{listener="`+listener+`",result="`+result+`"}`)
}

// httpsSample scrapes the admin API over HTTPS and returns one sample.
func httpsSample(t *testing.T, adminAddr string, cfg *tls.Config, sample string) float64 {
	t.Helper()
	code, body, err := httpsGet(t, "https://"+adminAddr+"/metrics", cfg)
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics over HTTPS: %d %v", code, err)
	}
	want := sample + " "
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, want); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s%s: %v", want, v, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", want)
	return 0
}

// A certificate rotation with SIGHUP: the connection made before it keeps
// publishing (its client trusts only the old CA, so a reconnect would fail),
// new connections get the new certificate on both listeners, and the reload
// is counted per listener.
func TestServeTLSReloadKeepsConnections(t *testing.T) {
	dir := t.TempDir()
	g := genCerts(t, dir, false)
	oldCA, _ := os.ReadFile(g.CA)
	cfg := tlsServeConfig(t, g)
	cfg.TLS.ReloadPollMs = 0 // SIGHUP only: the test decides when
	addr, adminAddr, stop := runServeAdmin(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()

	oldTLS := clientTLS(t, g.CA, "", "")
	old, err := dialOnce(ctx, addr, sinew.WithTLS(oldTLS))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	publishOne(t, old, "rotate")

	genCerts(t, dir, true) // the same paths, a new CA and certificates
	bothCAs := clientTLS(t, g.CA, "", "")
	bothCAs.RootCAs.AppendCertsFromPEM(oldCA)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	apiPoll(t, "both listeners reloaded", func() bool {
		return tlsReloadCount(t, adminAddr, bothCAs, "client", "ok") == 1 && tlsReloadCount(t, adminAddr, bothCAs, "admin", "ok") == 1
	})

	publishOne(t, old, "rotate") // the existing connection carries on
	if _, err := dialOnce(ctx, addr, sinew.WithTLS(oldTLS)); err == nil {
		t.Fatal("a new connection still verifies with the old CA after the reload")
	}
	fresh, err := dialOnce(ctx, addr, sinew.WithTLS(clientTLS(t, g.CA, "", "")))
	if err != nil {
		t.Fatalf("new connection with the new CA: %v", err)
	}
	publishOne(t, fresh, "rotate")
	fresh.Close()
	if code, _, err := httpsGet(t, "https://"+adminAddr+"/healthz", clientTLS(t, g.CA, "", "")); err != nil || code != http.StatusOK {
		t.Fatalf("admin with the new CA: %d %v", code, err)
	}

	// A broken key: the reload fails, is counted, and the current
	// certificate stays.
	if err := os.WriteFile(g.ServerKey, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	apiPoll(t, "failed reload counted", func() bool { return tlsReloadCount(t, adminAddr, bothCAs, "client", "failed") == 1 })
	again, err := dialOnce(ctx, addr, sinew.WithTLS(clientTLS(t, g.CA, "", "")))
	if err != nil {
		t.Fatalf("dial after a failed reload: %v", err)
	}
	publishOne(t, again, "rotate")
	again.Close()
	old.Close()
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// A TLS client on a plaintext port is told so at once, and does not retry.
func TestServeTLSClientOnPlaintextPort(t *testing.T) {
	g := genCerts(t, t.TempDir(), false)
	addr, _ := runServeT(t, testServeConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()
	_, err := sinew.Dial(ctx, addr, sinew.WithTLS(clientTLS(t, g.CA, "", "")))
	if !errors.Is(err, sinew.ErrServerNotTLS) {
		t.Fatalf("TLS client on a plaintext port: %v, want ErrServerNotTLS", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the error came only at the deadline")
	}
}

// tls.client_cert_user = cn: a client that presents the generated client
// certificate (CN sinew-client) and no credentials is the user sinew-client,
// with that user's permissions; a certificate naming no user is refused
// with auth_failed; a HELLO's own credentials still win over the certificate.
func TestServeCertificateAsUser(t *testing.T) {
	g := genCerts(t, t.TempDir(), false)
	cfg := tlsServeConfig(t, g)
	cfg.TLS.ClientCAFile, cfg.TLS.ClientAuth, cfg.TLS.ClientCertUser = g.CA, "verify_if_given", "cn"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	users := openTestUsers(t, cfg.DataDir)
	// Manage as well: their publishes create the queues on first use.
	if err := users.Add("sinew-client", "unused password", auth.Permissions{Publish: []string{"certs.*"}, Manage: []string{"certs.*"}}); err != nil {
		t.Fatal(err)
	}
	if err := users.Add("alice", "correct horse", auth.Permissions{Publish: []string{"*"}, Manage: []string{"other"}}); err != nil {
		t.Fatal(err)
	}
	addr, _, stop := runServeAdmin(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()

	c, err := dialOnce(ctx, addr, sinew.WithTLS(clientTLS(t, g.CA, g.ClientCert, g.ClientKey)))
	if err != nil {
		t.Fatalf("certificate user: %v", err)
	}
	publishOne(t, c, "certs.a")
	_, err = c.PublishText(ctx, "other", "m")
	var be *sinew.BrokerError
	if !errors.As(err, &be) || be.Code != protocol.CodePermissionDenied {
		t.Fatalf("certificate user publishing outside its permissions: %v, want permission_denied", err)
	}
	c.Close()

	// The same certificate with alice's credentials is alice.
	a, err := dialOnce(ctx, addr, sinew.WithTLS(clientTLS(t, g.CA, g.ClientCert, g.ClientKey)), sinew.WithUser("alice", "correct horse"))
	if err != nil {
		t.Fatalf("credentials over a client certificate: %v", err)
	}
	publishOne(t, a, "other")
	a.Close()

	// Without a certificate (verify_if_given) and without credentials: the
	// broker has users, so anonymous is refused as usual.
	if _, err := dialOnce(ctx, addr, sinew.WithTLS(clientTLS(t, g.CA, "", ""))); !errors.As(err, &be) || be.Code != protocol.CodeAuthFailed {
		t.Fatalf("no certificate, no credentials: %v, want auth_failed", err)
	}
	// A certificate whose name is no user.
	if err := users.Remove("sinew-client"); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	addr, _, _ = runServeAdmin(t, cfg)
	if _, err := dialOnce(ctx, addr, sinew.WithTLS(clientTLS(t, g.CA, g.ClientCert, g.ClientKey))); !errors.As(err, &be) || be.Code != protocol.CodeAuthFailed {
		t.Fatalf("certificate naming no user: %v, want auth_failed", err)
	}
}

// The CLI end to end: sinew cert generate writes 0600 files, refuses to
// overwrite them, and prints configuration that serve takes as it is
// (mutual TLS on the client listener, HTTPS on the admin one); publish,
// consume, queue and admin then connect with --tls-ca, --tls-cert and
// --tls-key, and fail with a clear message without them.
func TestCLICertGenerateAndTLSFlags(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	code, out, errOut := runCmd(t, "", "cert", "generate", "--dir", dir, "--hosts", "broker.test,10.1.2.3", "--days", "2")
	if code != 0 {
		t.Fatalf("cert generate exit %d: %s", code, errOut)
	}
	for _, name := range []string{tlsconf.CAFile, tlsconf.ServerCertFile, tlsconf.ServerKeyFile, tlsconf.ClientCertFile, tlsconf.ClientKeyFile} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v mode %v, want 0600", name, err, fi.Mode().Perm())
		}
	}
	if code, _, errOut := runCmd(t, "", "cert", "generate", "--dir", dir); code == 0 || !strings.Contains(errOut, "--force") {
		t.Fatalf("second generate: exit %d %q, want a refusal naming --force", code, errOut)
	}

	// The printed [tls] and [admin_tls] lines are a configuration serve
	// accepts.
	toml := filepath.Join(t.TempDir(), "sinew.toml")
	if err := os.WriteFile(toml, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := settings.Load(settings.Sources{File: toml})
	if err != nil {
		t.Fatalf("printed configuration does not load: %v\n%s", err, out)
	}
	cfg.Listen, cfg.DataDir = "127.0.0.1:0", t.TempDir()
	if cfg.TLS.ClientCAFile == "" || !cfg.AdminTLS.Enabled() {
		t.Fatalf("printed configuration lacks mTLS or admin TLS: %+v %+v", cfg.TLS, cfg.AdminTLS)
	}
	addr, adminAddr, _ := runServeAdmin(t, cfg)
	tlsArgs := []string{"--tls-ca", filepath.Join(dir, tlsconf.CAFile), "--tls-cert", filepath.Join(dir, tlsconf.ClientCertFile),
		"--tls-key", filepath.Join(dir, tlsconf.ClientKeyFile)}

	if code, _, errOut := runCmd(t, "one\ntwo\n", append([]string{"publish", "--addr", addr, "--topic", "secure"}, tlsArgs...)...); code != 0 {
		t.Fatalf("publish over mTLS: exit %d %s", code, errOut)
	}
	code, out, errOut = runCmd(t, "", append([]string{"consume", "--addr", addr, "--topic", "secure", "--count", "2"}, tlsArgs...)...)
	if code != 0 || out != "one\ntwo\n" {
		t.Fatalf("consume over mTLS: exit %d %q %s", code, out, errOut)
	}
	if code, _, errOut := runCmd(t, "", append([]string{"queue", "purge", "--addr", addr, "--topic", "secure"}, tlsArgs...)...); code != 0 {
		t.Fatalf("queue purge over mTLS: exit %d %s", code, errOut)
	}
	code, out, errOut = runCmd(t, "", append([]string{"admin", "queues", "--admin-addr", adminAddr, "--json"}, tlsArgs[:2]...)...)
	if code != 0 || !strings.Contains(out, "secure") {
		t.Fatalf("admin queues over HTTPS: exit %d %q %s", code, out, errOut)
	}

	// Without TLS flags: the broker's clear refusal, not a hang.
	code, _, errOut = runCmd(t, "x\n", "publish", "--addr", addr, "--topic", "secure", "--connect-timeout", "20s")
	if code == 0 || !strings.Contains(errOut, "requires TLS") {
		t.Fatalf("plaintext publish to a TLS port: exit %d %q", code, errOut)
	}
	// TLS flags against a plaintext port: the SDK says so.
	plain, _ := runServeT(t, testServeConfig(t))
	code, _, errOut = runCmd(t, "x\n", append([]string{"publish", "--addr", plain, "--topic", "p", "--connect-timeout", "20s"}, tlsArgs...)...)
	if code == 0 || !strings.Contains(errOut, "did not speak TLS") {
		t.Fatalf("TLS publish to a plaintext port: exit %d %q", code, errOut)
	}
}

// tls.reload_poll_ms: new files are picked up without a signal, on both
// listeners, and an unchanged file is not reloaded again.
func TestServeTLSReloadByPolling(t *testing.T) {
	dir := t.TempDir()
	g := genCerts(t, dir, false)
	oldCA, _ := os.ReadFile(g.CA)
	cfg := tlsServeConfig(t, g)
	cfg.TLS.ReloadPollMs = 100
	addr, adminAddr, stop := runServeAdmin(t, cfg)
	genCerts(t, dir, true)
	bothCAs := clientTLS(t, g.CA, "", "")
	bothCAs.RootCAs.AppendCertsFromPEM(oldCA)
	apiPoll(t, "both listeners reloaded by polling", func() bool {
		return tlsReloadCount(t, adminAddr, bothCAs, "client", "ok") >= 1 && tlsReloadCount(t, adminAddr, bothCAs, "admin", "ok") >= 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()
	c, err := dialOnce(ctx, addr, sinew.WithTLS(clientTLS(t, g.CA, "", "")))
	if err != nil {
		t.Fatalf("new CA after a polled reload: %v", err)
	}
	publishOne(t, c, "polled")
	c.Close()
	if n := tlsReloadCount(t, adminAddr, bothCAs, "client", "ok"); n != 1 {
		t.Fatalf("client listener reloaded %v times for one change", n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A peer that starts a TLS handshake on the TLS port and stalls is closed by
// the handshake timeout, like one that never sends its HELLO.
func TestServeTLSStalledHandshakeTimesOut(t *testing.T) {
	g := genCerts(t, t.TempDir(), false)
	cfg := tlsServeConfig(t, g)
	cfg.Connection.HandshakeTimeoutMs = 200
	addr, _, _ := runServeAdmin(t, cfg)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// The first bytes of a TLS record header, and nothing more.
	if _, err := nc.Write([]byte{0x16, 0x03, 0x01}); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(safetyTimeoutMs * time.Millisecond))
	_, err = io.Copy(io.Discard, nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the broker kept a stalled TLS handshake open past the safety timeout")
	}
}
