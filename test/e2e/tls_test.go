package e2e_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTLSRotationSIGHUPProcess rotates the certificates of a real `sinew
// serve` process with mutual TLS by writing new files (sinew cert generate
// --force, a new CA) and sending it SIGHUP. A `sinew consume` process
// connected before the rotation, which trusts only the old CA and so could
// not reconnect, keeps receiving on its connection; a `sinew publish` with the
// new files connects; one with the old CA is refused.
func TestTLSRotationSIGHUPProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	certs := filepath.Join(t.TempDir(), "certs")
	gen := func(args ...string) {
		t.Helper()
		out, err := exec.Command(bin, append([]string{"cert", "generate", "--dir", certs}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("cert generate: %v\n%s", err, out)
		}
	}
	gen()
	file := func(name string) string { return filepath.Join(certs, name) }
	oldCA := filepath.Join(t.TempDir(), "old-ca.pem")
	b, err := os.ReadFile(file("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(oldCA, b, 0o600); err != nil {
		t.Fatal(err)
	}

	srv := startChildArgs(t, bin, t.TempDir(), "--tls-cert-file", file("server.pem"), "--tls-key-file", file("server-key.pem"),
		"--tls-client-ca-file", file("ca.pem"), "--tls-reload-poll-ms", "0")
	tlsArgs := func(ca string) []string {
		return []string{"--tls-ca", ca, "--tls-cert", file("client.pem"), "--tls-key", file("client-key.pem")}
	}
	publish := func(ca, text string) (string, error) {
		cmd := exec.Command(bin, append([]string{"publish", "--addr", srv.addr, "--topic", "rot", "--connect-timeout", "20s"}, tlsArgs(ca)...)...)
		cmd.Stdin = strings.NewReader(text + "\n")
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("publish %s took %v", text, time.Since(start))
		return string(out), err
	}

	con := startCLI(t, bin, append([]string{"consume", "--addr", srv.addr, "--topic", "rot", "--count", "2"}, tlsArgs(oldCA)...)...)
	if out, err := publish(oldCA, "before"); err != nil {
		t.Fatalf("publish before the rotation: %v\n%s", err, out)
	}
	select {
	case <-con.seen:
	case <-con.done:
		t.Fatalf("consume exited (status %d):\n%s", con.status, con.stderr.String())
	case <-time.After(safetyTimeout):
		t.Fatalf("consume printed nothing; stderr:\n%s\nbroker:\n%s", con.stderr.String(), srv.log())
	}

	gen("--force")
	if err := srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(safetyTimeout)
	for !strings.Contains(srv.log(), "tls certificate reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload logged after SIGHUP:\n%s", srv.log())
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-srv.done:
			t.Fatalf("the broker exited on SIGHUP:\n%s", srv.log())
		}
	}

	if out, err := publish(oldCA, "old-ca"); err == nil || !strings.Contains(out, "unknown authority") {
		t.Fatalf("publish trusting the old CA after the rotation: err %v\n%s", err, out)
	}
	if out, err := publish(file("ca.pem"), "after"); err != nil {
		t.Fatalf("publish with the new files: %v\n%s", err, out)
	}
	con.wait(t, "consume")
	if con.status != 0 || strings.Join(con.lines, ",") != "before,after" {
		t.Fatalf("consume across the rotation: status %d lines %q\n%s", con.status, con.lines, con.stderr.String())
	}
}
