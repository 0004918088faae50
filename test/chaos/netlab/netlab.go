// Package netlab builds a small network out of Linux network namespaces for
// tests: one switch namespace holding a bridge, and one namespace per host
// wired to it by a veth pair, host i at 10.77.0.i/24. A test can take a
// host's cable out of the switch (Cut) and put it back (Heal), run a
// process inside a host's namespace (Exec) and open connections from
// inside one (Dialer).
//
// It creates only namespaces of its own and touches no interface or route of
// any other namespace (the test's own included). It needs root and the ip
// command (iproute2); ForTest skips the test with the reason where either is
// missing or the kernel refuses a namespace, and deletes every namespace it
// made when the test ends.
package netlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add` keeps its namespaces' handles.
const netnsDir = "/var/run/netns/"

// ErrUnavailable is returned (wrapped, with the reason) by New when this
// machine cannot create the lab: not root, no ip command, or no namespace
// support.
var ErrUnavailable = errors.New("netlab: network namespaces unavailable")

// Lab is a set of namespaces New created.
type Lab struct {
	prefix string
	hosts  []int
}

// New creates the switch namespace and one namespace per host number (1 to
// 254), named after prefix. On an error it deletes what it created.
func New(prefix string, hosts ...int) (*Lab, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: creating namespaces needs root", ErrUnavailable)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("%w: no ip command (install iproute2)", ErrUnavailable)
	}
	l := &Lab{prefix: prefix}
	if out, err := exec.Command("ip", "netns", "add", l.sw()).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: cannot create a network namespace: %v %s", ErrUnavailable, err, out)
	}
	err := errors.Join(ip("-n", l.sw(), "link", "add", "br0", "type", "bridge"),
		ip("-n", l.sw(), "link", "set", "br0", "up"))
	for _, i := range hosts {
		if err != nil {
			break
		}
		if i < 1 || i > 254 {
			err = fmt.Errorf("netlab: host number %d is not in 1..254", i)
			break
		}
		if err = ip("netns", "add", l.NS(i)); err != nil {
			break
		}
		l.hosts = append(l.hosts, i)
		err = errors.Join(
			ip("-n", l.NS(i), "link", "add", "eth0", "type", "veth", "peer", "name", l.swPort(i), "netns", l.sw()),
			ip("-n", l.NS(i), "addr", "add", l.IP(i)+"/24", "dev", "eth0"),
			ip("-n", l.NS(i), "link", "set", "eth0", "up"),
			ip("-n", l.NS(i), "link", "set", "lo", "up"),
			ip("-n", l.sw(), "link", "set", l.swPort(i), "master", "br0"),
			ip("-n", l.sw(), "link", "set", l.swPort(i), "up"))
	}
	if err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

// ForTest is New for a test: it skips t with the reason when the lab cannot
// be made, fails it on any other error, and deletes the namespaces when t
// ends. The namespaces are named after the process id, so two test
// processes do not meet.
func ForTest(t testing.TB, hosts ...int) *Lab {
	t.Helper()
	l, err := New(fmt.Sprintf("sinew%d", os.Getpid()%100000), hosts...)
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("network namespace test skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("netlab: %v", err)
		}
	})
	return l
}

func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (l *Lab) sw() string          { return l.prefix + "sw" }
func (l *Lab) swPort(i int) string { return fmt.Sprintf("p%d", i) }

// NS is host i's namespace.
func (l *Lab) NS(i int) string { return fmt.Sprintf("%sn%d", l.prefix, i) }

// IP is host i's address.
func (l *Lab) IP(i int) string { return fmt.Sprintf("10.77.0.%d", i) }

// Cut takes host i's cable out of the switch: it reaches no other host, and
// no other host reaches it, until Heal. Its own interface stays up.
func (l *Lab) Cut(i int) error { return ip("-n", l.sw(), "link", "set", l.swPort(i), "down") }

// Heal puts host i's cable back.
func (l *Lab) Heal(i int) error { return ip("-n", l.sw(), "link", "set", l.swPort(i), "up") }

// CutFrom drops, inside host i's namespace, everything it sends to the
// given hosts (blackhole routes to their addresses): i and they no longer
// reach each other (no reply gets back either), while every other host
// still reaches i. HealFrom undoes it.
func (l *Lab) CutFrom(i int, hosts ...int) error { return l.routes(i, "add", hosts) }

// HealFrom removes the routes CutFrom added in host i's namespace. It
// removes every one it can, and reports the first failure.
func (l *Lab) HealFrom(i int, hosts ...int) error { return l.routes(i, "del", hosts) }

func (l *Lab) routes(i int, op string, hosts []int) error {
	var first error
	for _, h := range hosts {
		if err := ip("-n", l.NS(i), "route", op, "blackhole", l.IP(h)+"/32"); err != nil && first == nil {
			first = err
			if op == "add" {
				return err
			}
		}
	}
	return first
}

// Exec is the command prefix that runs a program inside host i's namespace
// (`ip netns exec`, which execs the program in place: the process id is the
// program's).
func (l *Lab) Exec(i int) []string { return []string{"ip", "netns", "exec", l.NS(i)} }

// Dialer returns a dial function (net.Dialer.DialContext's shape) whose
// connections are opened from inside host i's namespace, so that a test
// running in its own namespace reaches the lab's addresses, host i's
// loopback included. Each dial runs on a thread locked to it, which enters
// the namespace, opens the connection (which keeps the namespace) and goes
// back before it is unlocked: no other goroutine ever runs in the lab's
// namespaces, and the thread lives on. (Letting it end instead would kill
// any child process started from that thread with a parent-death signal,
// as the chaos harness starts brokers.)
func (l *Lab) Dialer(i int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	path := netnsDir + l.NS(i)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		done := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			back, err := enter(path)
			if err != nil {
				runtime.UnlockOSThread() // still in its own namespace
				done <- result{nil, err}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if back() == nil {
				runtime.UnlockOSThread()
			} // else the goroutine ends locked, and its thread with it
			done <- result{c, err}
		}()
		r := <-done
		return r.c, r.err
	}
}

// enter moves the calling thread, locked, into the network namespace at
// path, and returns the function that moves it back.
func enter(path string) (back func() error, err error) {
	self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("netlab: open this thread's namespace: %w", err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(self)
		return nil, fmt.Errorf("netlab: open %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		unix.Close(self)
		return nil, fmt.Errorf("netlab: enter %s: %w", path, err)
	}
	return func() error {
		defer unix.Close(self)
		return unix.Setns(self, unix.CLONE_NEWNET)
	}, nil
}

// Close deletes every namespace of the lab (the veth pairs go with them).
func (l *Lab) Close() error {
	var errs []error
	for _, i := range l.hosts {
		errs = append(errs, ip("netns", "del", l.NS(i)))
	}
	l.hosts = nil
	errs = append(errs, ip("netns", "del", l.sw()))
	return errors.Join(errs...)
}
