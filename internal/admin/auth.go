package admin

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
)

// Bounds of admin authentication.
const (
	// AuthFailureDelayMsDefault is how long a request with wrong
	// credentials waits before its 401, the same for every reason, so that
	// guessing costs a second per try and per connection.
	AuthFailureDelayMsDefault = 1000
	// authCheckingMax bounds the requests with credentials being checked
	// or waiting out their failure delay at once. One more is answered 429
	// at once, before its credentials are looked at, so a flood of guesses
	// holds a bounded number of goroutines and hashes.
	authCheckingMax = 64
	// authHeaderBytesMax bounds the Authorization header looked at.
	authHeaderBytesMax = 4096
	// logUserBytesMax bounds a peer-chosen user name in a log record.
	logUserBytesMax = 64
	// laneWaitMs bounds how long a request with credentials waits for the
	// other checks from its address and for a password hash slot, in all
	// (429 after).
	laneWaitMs = 10_000
)

func isBasic(hdr string) bool {
	scheme, _, _ := strings.Cut(hdr, " ")
	return strings.EqualFold(scheme, "Basic")
}

// remoteIP is the address part of an http.Request's RemoteAddr.
func remoteIP(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// Realm is the realm of the admin listener's WWW-Authenticate challenges.
const Realm = "sinew admin"

// Gate authenticates the requests of the admin listener: HTTP basic auth
// against the users store, or a bearer token from auth.tokens. /healthz and
// /readyz are always served (probes carry no credentials); when anonymous
// access is not allowed, /readyz leaves out its problem lines, which name
// queues.
//
// A request is served when it carries valid credentials of an administrator
// (a static token, or a user allowed to manage every topic: "*" in its
// manage permissions), or carries none while Anonymous reports true. A wrong
// credential waits FailureDelayMs, is counted and logged (remote address,
// user name, reason; never the password or token), and gets 401 with
// WWW-Authenticate; a missing one gets the 401 at once. A valid user who is
// not an administrator gets 403. Basic-auth and bearer checks run one at a
// time per client address (auth.Lanes), a failed one holding the address
// through its delay; a basic-auth check that finds no argon2id hash slot
// within laneWaitMs gets 429.
type Gate struct {
	// Anonymous reports whether a request without credentials is served.
	// It is asked per request, since users may be added while the broker
	// runs (sinew serve passes auth.AnonymousAllowed for the admin
	// listener). Nil means never.
	Anonymous func() bool
	// Loopback says the listener is bound to loopback addresses only.
	// While such a listener serves requests without credentials, it
	// answers only requests whose Host header names the local host
	// (LoopbackHost): a web page the operator opens can make the browser
	// send requests to the listener under a name it controls (DNS
	// rebinding), and the browser's same-origin checks then let the page
	// read the answers. A name the page controls is never a loopback name.
	Loopback bool
	// Users checks basic auth; nil refuses every user name.
	Users *auth.Users
	// Tokens are the bearer tokens accepted (auth.tokens).
	Tokens []string
	// FailureDelayMs is the wait before a 401 for wrong credentials; 0
	// means AuthFailureDelayMsDefault, <0 none.
	FailureDelayMs int64
	// Logger receives one warning per failed authentication.
	Logger *slog.Logger
	// Sleep waits d or until ctx ends; nil uses a timer. Tests replace it.
	Sleep func(ctx context.Context, d time.Duration)

	checking atomic.Int64
	lanes    auth.Lanes    // credential checks, one at a time per client address
	missing  atomic.Uint64 // 401: no credentials where they are required
	failed   atomic.Uint64 // 401: wrong credentials
	denied   atomic.Uint64 // 403: valid, but not an administrator
	host     atomic.Uint64 // 403: foreign Host on an open loopback listener
	busy     atomic.Uint64 // 429: authCheckingMax requests were being checked
}

// GateStats count the requests the gate refused, by reason.
type GateStats struct {
	Missing uint64 // no credentials where they are required (401)
	Failed  uint64 // wrong or malformed credentials (401, after the delay)
	Denied  uint64 // valid credentials of a user who may not administer (403)
	Busy    uint64 // too many credential checks at once (429)
	Host    uint64 // a Host that is not loopback on an open loopback listener (403)
}

// Stats returns the gate's counters.
func (g *Gate) Stats() GateStats {
	return GateStats{Missing: g.missing.Load(), Failed: g.failed.Load(), Denied: g.denied.Load(), Busy: g.busy.Load(), Host: g.host.Load()}
}

type principalKey struct{}

// PrincipalFrom returns who an admin request authenticated as, and false
// when the request did not pass a Gate.
func PrincipalFrom(ctx context.Context) (auth.Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(auth.Principal)
	return p, ok
}

type hideProblemsKey struct{}

// problemsHidden reports whether /readyz should leave out its problem lines.
func problemsHidden(ctx context.Context) bool {
	hide, _ := ctx.Value(hideProblemsKey{}).(bool)
	return hide
}

// IsAdmin reports whether p may use the admin API: a principal with every
// permission (a static token, or anonymous where that is allowed), or a
// user who may manage every topic.
func IsAdmin(p auth.Principal) bool {
	return p.All || slices.Contains(p.Perms.Manage, "*")
}

func (g *Gate) anonymous() bool { return g.Anonymous != nil && g.Anonymous() }

// Wrap returns h behind the gate.
func (g *Gate) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		open := g.anonymous()
		foreign := open && g.Loopback && !LoopbackHost(r.Host)
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			// Probes are answered whatever Host they name: they say only
			// whether the process is up and ready. The problem lines name
			// queues, so a foreign Host does not get them.
			if !open || foreign {
				r = r.WithContext(context.WithValue(r.Context(), hideProblemsKey{}, true))
			}
			h.ServeHTTP(w, r)
			return
		}
		if foreign {
			g.host.Add(1)
			g.logger().Warn("admin request refused: Host is not a loopback name", "remote", r.RemoteAddr,
				"host", truncate(r.Host, logUserBytesMax), "method", r.Method, "path", r.URL.Path)
			writeError(w, http.StatusForbidden, "forbidden_host", fmt.Sprintf(
				"Host %q is not localhost, 127.0.0.1 or [::1]: this admin listener serves requests without credentials, "+
					"so it answers only requests addressed to the local host by a loopback name (a guard against DNS rebinding); "+
					"connect to http://127.0.0.1:PORT/ or configure a user or auth.tokens", truncate(r.Host, logUserBytesMax)))
			return
		}
		hdr := r.Header.Get("Authorization")
		if hdr == "" {
			if open {
				h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, auth.Anonymous())))
				return
			}
			g.missing.Add(1)
			g.challenge(w, "credentials required: HTTP basic auth (a user) or a bearer token (auth.tokens)")
			return
		}
		// Credential checks run one at a time per client address, a failed
		// one holding the address through its failure delay, so one address
		// guesses at most once per delay: a password check costs an
		// argon2id hash, and a token check, cheap as it is, must cost a
		// guesser as much. The lane is let go once the check is done (after
		// the delay when it failed), not when the request is: a slow request
		// does not hold up the next login from its address. The lane and a
		// hash slot are waited for laneWaitMs in all, then 429.
		ctx, cancel := context.WithTimeout(r.Context(), laneWaitMs*time.Millisecond)
		defer cancel()
		release, err := g.lanes.Acquire(ctx, remoteIP(r.RemoteAddr))
		if err != nil {
			g.tooBusy(w, "too many authentications from this address in progress; retry later")
			return
		}
		if g.checking.Add(1) > authCheckingMax {
			release()
			g.checking.Add(-1)
			g.tooBusy(w, "too many authentications in progress; retry later")
			return
		}
		p, user, reason, err := g.verify(ctx, remoteIP(r.RemoteAddr), hdr)
		if err != nil {
			// No hash slot came free in time: nothing was checked, so this
			// is no failed login and waits no delay.
			g.checking.Add(-1)
			release()
			g.logger().Warn("admin login not checked: no password hash slot free in time", "remote", r.RemoteAddr, "user", user)
			g.tooBusy(w, "the broker is busy checking other logins; retry later")
			return
		}
		if reason != "" {
			g.failed.Add(1)
			g.logger().Warn("admin authentication failed", "remote", r.RemoteAddr, "user", user, "reason", reason,
				"method", r.Method, "path", r.URL.Path)
			g.sleep(r.Context())
			g.checking.Add(-1)
			release()
			g.challenge(w, "authentication failed")
			return
		}
		g.checking.Add(-1)
		release()
		if !IsAdmin(p) {
			g.denied.Add(1)
			g.logger().Warn("admin request denied", "remote", r.RemoteAddr, "user", p.Name, "method", r.Method, "path", r.URL.Path)
			writeError(w, http.StatusForbidden, "forbidden", fmt.Sprintf("user %q may not administer the broker: it needs manage permission on \"*\"", p.Name))
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// verify checks an Authorization header from client address source. It
// returns the principal, or the user name offered (bounded, for the log)
// and why it was refused; err (wrapping auth.ErrBusy) when ctx ended before
// a password could be checked.
func (g *Gate) verify(ctx context.Context, source, hdr string) (p auth.Principal, user, reason string, err error) {
	if len(hdr) > authHeaderBytesMax {
		return p, "", "authorization header too long", nil
	}
	scheme, cred, _ := strings.Cut(hdr, " ")
	cred = strings.TrimSpace(cred)
	switch {
	case strings.EqualFold(scheme, "Basic"):
		raw, err := base64.StdEncoding.DecodeString(cred)
		if err != nil {
			return p, "", "basic credentials are not base64", nil
		}
		name, password, ok := strings.Cut(string(raw), ":")
		user = name
		if len(user) > logUserBytesMax {
			user = user[:logUserBytesMax]
		}
		if !ok {
			return p, user, "basic credentials without a colon", nil
		}
		if g.Users == nil {
			return p, user, "no users configured", nil
		}
		up, err := g.Users.VerifyFrom(ctx, source, name, password)
		if errors.Is(err, auth.ErrBusy) {
			return p, user, "", err
		}
		if err != nil {
			return p, user, "unknown user or wrong password", nil
		}
		return up, user, "", nil
	case strings.EqualFold(scheme, "Bearer"):
		match := -1
		for i, t := range g.Tokens {
			// Every token is compared, so the time taken does not say which
			// one matched.
			if subtle.ConstantTimeCompare([]byte(cred), []byte(t)) == 1 {
				match = i
			}
		}
		if match < 0 {
			return p, "", "token matches none of auth.tokens", nil
		}
		return auth.TokenPrincipal(match), "", "", nil
	}
	return p, "", "unsupported authorization scheme", nil
}

// LoopbackHost reports whether host, an HTTP Host header, names the local
// host by a loopback name: "localhost", an IPv4 address in 127.0.0.0/8 or
// "[::1]", each with or without a numeric port, "localhost" in any case. A
// DNS name other than localhost never counts, even one that resolves to
// 127.0.0.1 now: resolution is what a rebinding attacker controls.
func LoopbackHost(host string) bool {
	h := host
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return false
		}
		if rest := h[end+1:]; rest != "" {
			port, ok := strings.CutPrefix(rest, ":")
			if !ok || !validPort(port) {
				return false
			}
		}
		ip, err := netip.ParseAddr(h[1:end])
		return err == nil && ip.Is6() && ip.Zone() == "" && ip.Unmap().IsLoopback()
	}
	if name, port, ok := strings.Cut(h, ":"); ok {
		if !validPort(port) {
			return false
		}
		h = name
	}
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(h)
	return err == nil && ip.Is4() && ip.IsLoopback()
}

// validPort reports whether p is a decimal TCP port, 0 to 65535.
func validPort(p string) bool {
	if p == "" || len(p) > 5 {
		return false
	}
	n := 0
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
		n = n*10 + int(p[i]-'0')
	}
	return n <= 65535
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// tooBusy answers 429 with Retry-After and counts it.
func (g *Gate) tooBusy(w http.ResponseWriter, msg string) {
	g.busy.Add(1)
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusTooManyRequests, "too_many_requests", msg)
}

func (g *Gate) challenge(w http.ResponseWriter, msg string) {
	w.Header().Add("WWW-Authenticate", `Basic realm="`+Realm+`", charset="UTF-8"`)
	w.Header().Add("WWW-Authenticate", `Bearer realm="`+Realm+`"`)
	writeError(w, http.StatusUnauthorized, "unauthorized", msg)
}

func (g *Gate) sleep(ctx context.Context) {
	ms := g.FailureDelayMs
	if ms == 0 {
		ms = AuthFailureDelayMsDefault
	}
	if ms < 0 {
		return
	}
	d := time.Duration(ms) * time.Millisecond
	if g.Sleep != nil {
		g.Sleep(ctx, d)
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (g *Gate) logger() *slog.Logger {
	if g.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return g.Logger
}
