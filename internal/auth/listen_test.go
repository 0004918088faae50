package auth

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
)

func TestLoopbackListen(t *testing.T) {
	lookup := func(_ context.Context, host string) ([]net.IPAddr, error) {
		switch host {
		case "lo.example":
			return []net.IPAddr{{IP: net.ParseIP("127.0.0.2")}, {IP: net.ParseIP("::1")}}, nil
		case "mixed.example":
			return []net.IPAddr{{IP: net.ParseIP("127.0.0.1")}, {IP: net.ParseIP("10.0.0.1")}}, nil
		}
		return nil, errors.New("no such host")
	}
	for addr, want := range map[string]bool{
		"127.0.0.1:7654": true, "127.1.2.3:1": true, "[::1]:7654": true, "localhost:7654": true, "lo.example:1": true,
		":7654": false, "0.0.0.0:7654": false, "[::]:7654": false, "10.0.0.1:7654": false, "mixed.example:1": false,
	} {
		got, err := LoopbackListen(addr, lookup)
		if err != nil || got != want {
			t.Errorf("LoopbackListen(%q) = %v, %v; want %v", addr, got, err, want)
		}
	}
	if got, err := LoopbackListen("nowhere.example:1", lookup); err == nil || got {
		t.Errorf("unresolvable host: %v, %v; want an error", got, err)
	}
	if _, err := LoopbackListen("no-port", lookup); err == nil {
		t.Error("address without port accepted")
	}
}

func TestLoopbackAddr(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	for _, c := range []struct {
		a    net.Addr
		want bool
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, true},
		{&net.TCPAddr{IP: net.ParseIP("::1")}, true},
		{&net.TCPAddr{IP: net.IPv4zero}, false},
		{&net.TCPAddr{IP: net.ParseIP("192.168.1.2")}, false},
		{a.LocalAddr(), true},
	} {
		if got := LoopbackAddr(c.a); got != c.want {
			t.Errorf("LoopbackAddr(%v) = %v, want %v", c.a, got, c.want)
		}
	}
}

func TestStartupCheck(t *testing.T) {
	if warn, err := StartupCheck("listen", ":7654", false, false, false); err == nil || warn ||
		!strings.Contains(err.Error(), "auth.allow_anonymous") || !strings.Contains(err.Error(), "auth.tokens") {
		t.Errorf("open non-loopback: %v, %v", warn, err)
	}
	if warn, err := StartupCheck("listen", ":7654", false, false, true); err != nil || !warn {
		t.Errorf("allow_anonymous: %v, %v; want a warning", warn, err)
	}
	if warn, err := StartupCheck("listen", ":7654", false, true, false); err != nil || warn {
		t.Errorf("auth configured: %v, %v", warn, err)
	}
	if warn, err := StartupCheck("listen", "127.0.0.1:7654", true, false, false); err != nil || warn {
		t.Errorf("loopback: %v, %v", warn, err)
	}
	if AnonymousAllowed(false, true, true) || AnonymousAllowed(false, false, false) || !AnonymousAllowed(false, true, false) || !AnonymousAllowed(true, false, true) {
		t.Error("AnonymousAllowed table wrong")
	}
}
