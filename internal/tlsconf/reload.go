package tlsconf

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
)

// pemFileBytesMax bounds one certificate, key or CA file. Real chains and CA
// bundles are a few hundred kilobytes at most.
const pemFileBytesMax = 4 << 20

// ClientAuth says whether a listener asks for a client certificate.
type ClientAuth string

// The client certificate policies. They apply only with a client CA.
const (
	// ClientAuthNone asks for no client certificate.
	ClientAuthNone ClientAuth = ""
	// ClientAuthRequire refuses a handshake without a client certificate
	// that the client CA verifies.
	ClientAuthRequire ClientAuth = "require"
	// ClientAuthVerifyIfGiven accepts a client without a certificate, and
	// verifies one that is given against the client CA.
	ClientAuthVerifyIfGiven ClientAuth = "verify_if_given"
)

// ParseClientAuth checks a tls.client_auth value. Empty means require when a
// client CA is configured.
func ParseClientAuth(s string) (ClientAuth, error) {
	switch ClientAuth(s) {
	case ClientAuthNone, ClientAuthRequire, ClientAuthVerifyIfGiven:
		return ClientAuth(s), nil
	}
	return "", fmt.Errorf("client_auth %q: want require or verify_if_given", s)
}

// Files names one listener's TLS material.
type Files struct {
	// CertFile is a PEM certificate chain, leaf first; KeyFile its key.
	CertFile, KeyFile string
	// ClientCAFile, when set, is a PEM bundle of the CAs that sign client
	// certificates; ClientAuth says whether one is required.
	ClientCAFile string
	ClientAuth   ClientAuth
}

// Options are a Reloader's collaborators.
type Options struct {
	// Name is the settings section, "tls" (the default) or "admin_tls":
	// errors and log records name keys with it.
	Name string
	// Logger receives reload outcomes; nil discards them.
	Logger *slog.Logger
	// FS reads the files; nil is the operating system's.
	FS vfs.FS
	// Time, when set, is the clock handshakes verify certificate validity
	// against (tls.Config.Time); tests use it for expiry.
	Time func() time.Time
}

// material is one loaded generation of the files, immutable once stored.
type material struct {
	cfg      *tls.Config
	notAfter time.Time // the leaf certificate's expiry
	hash     [sha256.Size]byte
}

// Reloader serves one listener's TLS configuration and reloads it from its
// files. Its methods are safe for concurrent use.
type Reloader struct {
	files Files
	o     Options

	cur atomic.Pointer[material]

	mu       sync.Mutex        // serialises reloads
	lastSeen [sha256.Size]byte // hash of the files last tried, loaded or not

	reloads, failures atomic.Uint64
}

// Stats are a Reloader's counters.
type Stats struct {
	// Reloads counts reloads that replaced the material; Failures those that
	// kept the old material because the new files did not load.
	Reloads, Failures uint64
	// NotAfter is the current certificate's expiry.
	NotAfter time.Time
}

// NewReloader loads f once; an error names the file at fault, and no
// Reloader is returned, so a broker with broken files does not start.
func NewReloader(f Files, o Options) (*Reloader, error) {
	if o.Name == "" {
		o.Name = "tls"
	}
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, fmt.Errorf("%s.cert_file and %s.key_file must both be set", o.Name, o.Name)
	}
	if f.ClientAuth != ClientAuthNone && f.ClientCAFile == "" {
		return nil, fmt.Errorf("%s.client_auth %q needs %s.client_ca_file", o.Name, f.ClientAuth, o.Name)
	}
	if f.ClientCAFile != "" && f.ClientAuth == ClientAuthNone {
		f.ClientAuth = ClientAuthRequire
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.FS == nil {
		o.FS = vfs.OS()
	}
	r := &Reloader{files: f, o: o}
	m, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur.Store(m)
	r.lastSeen = m.hash
	r.warnValidity(m)
	return r, nil
}

// warnValidity logs a certificate that clients will refuse as it is: one
// already expired or not yet valid. It is served anyway, so that fixing
// the files and reloading is all it takes.
func (r *Reloader) warnValidity(m *material) {
	now := time.Now()
	if r.o.Time != nil {
		now = r.o.Time()
	}
	leaf := m.cfg.Certificates[0].Leaf
	switch {
	case now.After(leaf.NotAfter):
		r.o.Logger.Warn("tls certificate has expired; clients will refuse it", "section", r.o.Name, "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		r.o.Logger.Warn("tls certificate is not valid yet; clients will refuse it", "section", r.o.Name, "not_before", leaf.NotBefore.UTC().Format(time.RFC3339))
	}
}

// ServerConfig returns the listener's tls.Config. It picks the current
// material at each handshake, so reloads reach new connections only.
func (r *Reloader) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.cur.Load().cfg, nil
		},
	}
}

// Stats returns the counters and the current certificate's expiry.
func (r *Reloader) Stats() Stats {
	return Stats{Reloads: r.reloads.Load(), Failures: r.failures.Load(), NotAfter: r.cur.Load().notAfter}
}

// Reload reads the files again and, when they load, serves them to new
// handshakes. On failure the old material stays, the failure is logged and
// counted, and the error is returned.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reloadLocked()
}

func (r *Reloader) reloadLocked() error {
	m, err := r.load()
	if m != nil {
		r.lastSeen = m.hash
	}
	if err != nil {
		r.failures.Add(1)
		r.o.Logger.Error("tls reload failed; keeping the current certificate", "section", r.o.Name, "err", err)
		return err
	}
	r.cur.Store(m)
	r.reloads.Add(1)
	r.o.Logger.Info("tls certificate reloaded", "section", r.o.Name, "not_after", m.notAfter.UTC().Format(time.RFC3339))
	r.warnValidity(m)
	return nil
}

// ReloadIfChanged reloads when the files' contents differ from the last ones
// tried, and reports whether it tried. Files that fail to load are not tried
// again until they change.
func (r *Reloader) ReloadIfChanged() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, err := r.hashFiles()
	if err != nil {
		// A file being replaced may be missing for a moment; the next
		// tick looks again. Only a failed load is counted.
		return false, nil
	}
	if h == r.lastSeen {
		return false, nil
	}
	return true, r.reloadLocked()
}

// Watch calls ReloadIfChanged on every tick until ctx ends. The caller owns
// the ticker (a time.Ticker's channel in serve, a test's channel in tests).
func (r *Reloader) Watch(ctx context.Context, tick <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			r.ReloadIfChanged()
		}
	}
}

// paths lists the files in a fixed order for hashing, with their keys.
func (r *Reloader) paths() (paths, keys []string) {
	paths = []string{r.files.CertFile, r.files.KeyFile}
	keys = []string{"cert_file", "key_file"}
	if r.files.ClientCAFile != "" {
		paths = append(paths, r.files.ClientCAFile)
		keys = append(keys, "client_ca_file")
	}
	return paths, keys
}

// key names one setting of this listener's section, e.g. tls.cert_file.
func (r *Reloader) key(k string) string { return r.o.Name + "." + k }

// readAll reads every file and returns the contents and their hash. The
// hash covers the contents alone: a touch without a change reloads nothing,
// and a same-size rewrite within one mtime tick is still seen.
func (r *Reloader) readAll() ([][]byte, [sha256.Size]byte, error) {
	h := sha256.New()
	var out [][]byte
	paths, keys := r.paths()
	for i, p := range paths {
		b, err := vfs.ReadFileMax(r.o.FS, p, pemFileBytesMax)
		if err != nil {
			return nil, [sha256.Size]byte{}, fmt.Errorf("%s %s: %w", r.key(keys[i]), p, err)
		}
		if keys[i] == "key_file" {
			// Whoever can read the private key can pose as the broker.
			if err := vfs.CheckPrivate(r.o.FS, p); err != nil {
				return nil, [sha256.Size]byte{}, fmt.Errorf("%s %s: %w", r.key(keys[i]), p, err)
			}
		}
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
		out = append(out, b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return out, sum, nil
}

func (r *Reloader) hashFiles() ([sha256.Size]byte, error) {
	_, h, err := r.readAll()
	return h, err
}

// load reads and parses the files. It returns the material's hash even when
// parsing fails (m with a nil cfg), so a broken file is not retried until
// it changes.
func (r *Reloader) load() (*material, error) {
	data, sum, err := r.readAll()
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*material, error) { return &material{hash: sum}, err }
	cert, err := tls.X509KeyPair(data[0], data[1])
	if err != nil {
		return fail(fmt.Errorf("%s %s with %s %s: %w", r.key("cert_file"), r.files.CertFile, r.key("key_file"), r.files.KeyFile, err))
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		Time:         r.o.Time,
	}
	if r.files.ClientCAFile != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data[2]) {
			return fail(fmt.Errorf("%s %s: no PEM certificate found", r.key("client_ca_file"), r.files.ClientCAFile))
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		if r.files.ClientAuth == ClientAuthVerifyIfGiven {
			cfg.ClientAuth = tls.VerifyClientCertIfGiven
		}
	}
	return &material{cfg: cfg, notAfter: cert.Leaf.NotAfter, hash: sum}, nil
}
