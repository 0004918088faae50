package e2e_test

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/protocol"
)

// `sinew serve` with no configuration keeps dropped sessions for 5 s: HELLO_OK
// says so, and the value is the seeded runtime settings document. A damaged
// document, and the old startup key, stop the process with a clear error.
func TestServeGraceOnByDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	t.Setenv("SINEW_CONFIG", "")
	bin := buildSinew(t)
	dir := t.TempDir()
	srv := startChild(t, bin, dir)
	nc, err := net.Dial("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &client{t: t, nc: nc, br: bufio.NewReader(nc)}
	c.send(0, &protocol.Hello{ProtocolVersion: protocol.Version})
	if ok := expect[*protocol.HelloOK](c); ok.ReconnectGraceMs != 5000 {
		t.Fatalf("HELLO_OK reconnect_grace_ms %d, want 5000", ok.ReconnectGraceMs)
	}
	stopChild(t, srv)
	doc, err := os.ReadFile(filepath.Join(dir, "runtime-settings.json"))
	if err != nil || !strings.Contains(string(doc), `"connection.reconnect_grace_ms": 5000`) {
		t.Fatalf("runtime settings document: %v\n%s", err, doc)
	}

	// One flipped digit: the checksum no longer matches, and serve refuses
	// to start rather than reset the settings.
	bad := strings.Replace(string(doc), "5000", "5001", 1)
	if err := os.WriteFile(filepath.Join(dir, "runtime-settings.json"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runSinew(t, bin, "", "serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--admin-listen", "")
	if code == 0 || !strings.Contains(stderr, "runtime-settings.json") || !strings.Contains(stderr, "corrupt") {
		t.Fatalf("serve on a corrupt runtime settings document: exit %d\n%s", code, stderr)
	}

	code, _, stderr = runSinew(t, bin, "", "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "",
		"--connection-reconnect-grace-ms", "0")
	if code == 0 || !strings.Contains(stderr, "runtime_seed.connection.reconnect_grace_ms") {
		t.Fatalf("serve with the old startup key: exit %d\n%s", code, stderr)
	}
}
