package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/settings"
	"github.com/sinewmq/sinew/internal/tlsconf"
)

// tlsReloaders are the listeners' TLS reloaders; nil where a listener
// speaks plaintext.
type tlsReloaders struct {
	client, admin *tlsconf.Reloader
	clientLn      *tlsconf.Listener // the client listener with TLS; counts refused handshakes
}

// list returns the reloaders that exist.
func (r tlsReloaders) list() []*tlsconf.Reloader {
	var out []*tlsconf.Reloader
	for _, x := range []*tlsconf.Reloader{r.client, r.admin} {
		if x != nil {
			out = append(out, x)
		}
	}
	return out
}

// clientListener listens on cfg.Listen, with TLS when tls.cert_file and
// tls.key_file are set. The sniff and the TLS handshake run on the
// connection's reader goroutine at its first read, so the handshake timeout
// covers them; a plaintext Sinew client gets ERROR bad_request saying the
// port needs TLS.
func clientListener(cfg settings.Config, logger *slog.Logger) (net.Listener, *tlsconf.Reloader, error) {
	var r *tlsconf.Reloader
	var certUser tlsconf.CertUser
	if cfg.TLS.Enabled() {
		auth, err := tlsconf.ParseClientAuth(cfg.TLS.ClientAuth)
		if err != nil {
			return nil, nil, fmt.Errorf("tls.%w", err)
		}
		if certUser, err = tlsconf.ParseCertUser(cfg.TLS.ClientCertUser); err != nil {
			return nil, nil, fmt.Errorf("tls.%w", err)
		}
		r, err = tlsconf.NewReloader(tlsconf.Files{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile,
			ClientCAFile: cfg.TLS.ClientCAFile, ClientAuth: auth}, tlsconf.Options{Name: "tls", Logger: logger.With("component", "tls")})
		if err != nil {
			return nil, nil, err
		}
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, nil, fmt.Errorf("listen: %w", err)
	}
	if r != nil {
		return tlsconf.NewListener(ln, r.ServerConfig(), tlsconf.ListenerOptions{CertUser: certUser}), r, nil
	}
	return ln, nil, nil
}

// adminListener listens on cfg.AdminListen, with HTTPS when admin_tls
// files are set. net/http answers a plaintext HTTP request on it with
// "400 Client sent an HTTP request to an HTTPS server"; a Sinew client gets
// an ERROR naming clientAddr, the client listener.
func adminListener(cfg settings.Config, clientAddr string, logger *slog.Logger) (net.Listener, *tlsconf.Reloader, error) {
	var r *tlsconf.Reloader
	if cfg.AdminTLS.Enabled() {
		auth, err := tlsconf.ParseClientAuth(cfg.AdminTLS.ClientAuth)
		if err != nil {
			return nil, nil, fmt.Errorf("admin_tls.%w", err)
		}
		r, err = tlsconf.NewReloader(tlsconf.Files{CertFile: cfg.AdminTLS.CertFile, KeyFile: cfg.AdminTLS.KeyFile,
			ClientCAFile: cfg.AdminTLS.ClientCAFile, ClientAuth: auth}, tlsconf.Options{Name: "admin_tls", Logger: logger.With("component", "tls")})
		if err != nil {
			return nil, nil, err
		}
	}
	ln, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		return nil, nil, fmt.Errorf("admin listen: %w", err)
	}
	// Under TLS, so net/http still sees the *tls.Conn it needs.
	ln = admin.SinewGuardListener(admin.LimitListener(ln, admin.ConnectionsMax), clientAddr)
	if r != nil {
		return tls.NewListener(ln, r.ServerConfig()), r, nil
	}
	return ln, nil, nil
}

// watchTLSReload reloads the listeners' certificates on SIGHUP (every file,
// changed or not) and, every pollMs (0: never), those whose files changed.
// SIGHUP is caught for the whole of serve, TLS or not, so it never ends
// the process; without TLS it is only logged.
func watchTLSReload(rs tlsReloaders, pollMs int64, logger *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	var tick <-chan time.Time
	var ticker *time.Ticker
	if pollMs > 0 && len(rs.list()) > 0 {
		ticker = time.NewTicker(time.Duration(pollMs) * time.Millisecond)
		tick = ticker.C
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if len(rs.list()) == 0 {
					logger.Info("SIGHUP: no TLS configured, nothing to reload")
				}
				// Each Reload logs its own outcome and counts it.
				for _, r := range rs.list() {
					r.Reload()
				}
			case <-tick:
				for _, r := range rs.list() {
					r.ReloadIfChanged()
				}
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		cancel()
		<-done
		if ticker != nil {
			ticker.Stop()
		}
	}
}

// The certificate reloads of both listeners.
const (
	tlsReloadsName = "sinew_tls_reloads_total"
	tlsReloadsHelp = "Certificate reloads (SIGHUP or a changed file under tls.reload_poll_ms), by listener (client, admin) and result: ok (new connections get the new files) or failed (the files did not load; the previous certificate stays and the log says why). Zero on a listener without TLS."
)

var tlsReloadsDesc = prometheus.NewDesc(tlsReloadsName, tlsReloadsHelp, []string{"listener", "result"}, nil)

// The client listener's refused TLS connections.
const (
	tlsFailuresName = "sinew_tls_handshake_failures_total"
	tlsFailuresHelp = "Connections to the TLS client listener refused before HELLO, by reason: plaintext (the peer spoke without TLS and got ERROR bad_request) or handshake (a TLS handshake that failed: untrusted, expired or missing client certificate, no common version, a timeout or a cut). log_level = debug logs each with its cause. Zero without TLS."
)

var tlsFailuresDesc = prometheus.NewDesc(tlsFailuresName, tlsFailuresHelp, []string{"reason"}, nil)

// tlsCollector exports the reloaders' counters at scrape time.
type tlsCollector struct{ rs tlsReloaders }

// Describe implements prometheus.Collector.
func (c tlsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- tlsReloadsDesc
	ch <- tlsFailuresDesc
}

// Collect implements prometheus.Collector.
func (c tlsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range []struct {
		name string
		r    *tlsconf.Reloader
	}{{"client", c.rs.client}, {"admin", c.rs.admin}} {
		var st tlsconf.Stats
		if l.r != nil {
			st = l.r.Stats()
		}
		ch <- prometheus.MustNewConstMetric(tlsReloadsDesc, prometheus.CounterValue, float64(st.Reloads), l.name, "ok")
		ch <- prometheus.MustNewConstMetric(tlsReloadsDesc, prometheus.CounterValue, float64(st.Failures), l.name, "failed")
	}
	var ls tlsconf.ListenerStats
	if c.rs.clientLn != nil {
		ls = c.rs.clientLn.Stats()
	}
	ch <- prometheus.MustNewConstMetric(tlsFailuresDesc, prometheus.CounterValue, float64(ls.Plaintext), "plaintext")
	ch <- prometheus.MustNewConstMetric(tlsFailuresDesc, prometheus.CounterValue, float64(ls.Failed), "handshake")
}
