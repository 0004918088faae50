package testkit

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/protocol"
)

// helloOK dials addr, sends HELLO and returns the server's answer.
func helloOK(t *testing.T, addr string) *protocol.HelloOK {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A safety bound so a broken server fails the test instead of hanging it.
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := nc.Write(protocol.AppendFrame(nil, 0, 1, &protocol.Hello{ProtocolVersion: protocol.Version})); err != nil {
		t.Fatal(err)
	}
	f, _, err := protocol.ReadFrame(bufio.NewReader(nc), 1<<24, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := protocol.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	ok, isOK := body.(*protocol.HelloOK)
	if !isOK {
		t.Fatalf("got %s %+v, want HELLO_OK", f.Op, body)
	}
	return ok
}

func TestStartBrokerServesTheBroker(t *testing.T) {
	b := StartBroker(t, WithServerConfig(func(c *server.Config) { c.ServerVersion = "tuned" }))
	if b.Broker == nil || b.Server == nil {
		t.Fatalf("handles %+v, want a broker and a server", b)
	}
	if ok := helloOK(t, b.Addr); ok.ServerVersion != "tuned" {
		t.Fatalf("HELLO_OK %+v, want server version \"tuned\"", ok)
	}
}

func TestStartBrokerOnDataDirAndBackend(t *testing.T) {
	onDisk := StartBroker(t, WithDataDir(t.TempDir()))
	if onDisk.Broker == nil {
		t.Fatal("WithDataDir: no broker")
	}
	helloOK(t, onDisk.Addr)
	fake := StartBroker(t, WithBackend(sessiontest.New()))
	if fake.Broker != nil {
		t.Fatalf("WithBackend opened a broker too: %+v", fake.Broker)
	}
	helloOK(t, fake.Addr)
}
