package auth

import (
	"context"
	"fmt"
	"net"
	"time"
)

// lookupTimeoutMs bounds the name resolution of a listen address at startup.
const lookupTimeoutMs = 5000

// LoopbackListen reports whether the listen address addr ("host:port") binds
// loopback addresses only: every address its host resolves to is loopback
// (127.0.0.0/8, ::1). "localhost" counts without a lookup. An empty host
// (":7654") and the unspecified addresses ("0.0.0.0", "::") bind every
// interface, so they are not loopback; neither is a name that cannot be
// resolved. lookup resolves other names; nil uses net.DefaultResolver,
// bounded by lookupTimeoutMs.
func LoopbackListen(addr string, lookup func(ctx context.Context, host string) ([]net.IPAddr, error)) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("auth: listen address %q: %w", addr, err)
	}
	switch host {
	case "":
		return false, nil
	case "localhost":
		return true, nil
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback(), nil
	}
	if lookup == nil {
		lookup = net.DefaultResolver.LookupIPAddr
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeoutMs*time.Millisecond)
	defer cancel()
	ips, err := lookup(ctx, host)
	if err != nil {
		return false, fmt.Errorf("auth: resolve listen host %q: %w", host, err)
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return false, nil
		}
	}
	return len(ips) > 0, nil
}

// LoopbackAddr reports whether a bound address (a listener's or a
// connection's local address) is a loopback IP. Addresses that are not IP
// addresses at all (an in-process pipe) count as loopback: they cannot be
// reached from another machine.
func LoopbackAddr(a net.Addr) bool {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UDPAddr:
		return a.IP.IsLoopback()
	case *net.IPAddr:
		return a.IP.IsLoopback()
	case nil:
		return true
	}
	return a.Network() != "tcp" && a.Network() != "tcp4" && a.Network() != "tcp6"
}

// AnonymousAllowed is the rule for a connection without credentials:
// allowAnonymous (auth.allow_anonymous) admits it anywhere; otherwise only a
// loopback-only listener on a broker with no authentication configured
// (no users, no static tokens) does.
func AnonymousAllowed(allowAnonymous, loopbackListener, authConfigured bool) bool {
	return allowAnonymous || (loopbackListener && !authConfigured)
}

// StartupCheck applies the startup rule to a listener: a listener that is
// not loopback-only needs authentication configured or allowAnonymous. It
// returns an error naming the fixes when the listener must not start, and
// warn = true when it starts open to anonymous peers on a non-loopback
// address (the caller logs a warning). what names the listener in the
// message ("listen", "admin_listen").
func StartupCheck(what, addr string, loopback, authConfigured, allowAnonymous bool) (warn bool, err error) {
	if loopback || authConfigured {
		return false, nil
	}
	if allowAnonymous {
		return true, nil
	}
	return false, fmt.Errorf("refusing to start: %s = %q is not a loopback address and no authentication is configured; "+
		"add a user offline (sinew admin user add NAME --manage '*' --password-stdin --data-dir DIR), set auth.tokens, "+
		"listen on 127.0.0.1 only, or set auth.allow_anonymous = true to accept anyone", what, addr)
}
