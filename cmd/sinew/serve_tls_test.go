package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
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
	code, body, err := httpsGet(t, "https://"+adminAddr+"/healthz", clientTLS(t, g.CA, g.ClientCert, g.ClientKey))
	if err != nil || code != http.StatusOK {
		t.Fatalf("admin over HTTPS: %d %q %v", code, body, err)
	}
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
	code, body, err := httpsGet(t, "https://"+adminAddr+"/metrics", cfg)
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics over HTTPS: %d %v", code, err)
	}
	want := `sinew_tls_reloads_total{listener="` + listener + `",result="` + result + `"} `
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, want); ok {
			return map[string]float64{"0": 0, "1": 1, "2": 2}[v]
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
