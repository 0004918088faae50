package server

import (
	"bufio"
	"context"
	"io"
	"net"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// FuzzHelloAuth sends one HELLO with arbitrary user, credentials and client
// name to a server with users and tokens configured, from a source address
// (so the login lanes and the failed-address table are in play). The server
// must never panic, and must admit exactly the right password of a user or
// exactly a configured token: anything else gets one fatal ERROR
// (auth_failed, or bad_frame for a string that is not UTF-8) and the close.
// The seed corpus runs as a plain test in go test.
func FuzzHelloAuth(f *testing.F) {
	const (
		password = "correct horse battery"
		token    = "fuzz-token-0123456789abcdef0123456789"
	)
	for _, s := range [][3]string{
		{"alice", password, "app"},
		{"", token, ""},
		{"alice", "wrong", ""},
		{"alice", password + "x", ""},
		{"alice", password[:len(password)-1], ""},
		{"mallory", password, ""},
		{"", token[:len(token)-1], ""},
		{"", token + " ", ""},
		{"", "", ""},
		{"alice", "", ""},
		{"", password, ""},
		{"token#1", token, ""},
		{"alice\x00", password, ""},
		{"\xff", password, ""},
		{"alice", "\xc3\x28", ""},
		{"ALICE", password, ""},
	} {
		f.Add(s[0], s[1], s[2], uint8(1))
	}
	f.Add("alice", password, "x", uint8(0))

	users, err := auth.OpenUsersWith(vfs.NewMem(), "/data/meta/users", auth.UsersOptions{Params: cheapHash})
	if err != nil {
		f.Fatal(err)
	}
	if err := users.Add("alice", password, auth.Permissions{Publish: []string{"*"}}); err != nil {
		f.Fatal(err)
	}
	srv, err := New(Config{Backend: sessiontest.New(), OwnerID: "o", Rand: &seq{}, HandshakeTimeoutMs: 5000,
		Users: users, AuthTokens: []string{"other-token-0123456789abcdef0123456789", token}, AuthFailureDelayMs: -1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})

	f.Fuzz(func(t *testing.T, user, cred, clientName string, version uint8) {
		if len(user)+len(cred)+len(clientName) > 64<<10 {
			t.Skip("larger than any HELLO worth checking")
		}
		a, b := net.Pipe()
		served := make(chan struct{})
		go func() {
			srv.ServeConn(addrConn{Conn: b, remote: &net.TCPAddr{IP: net.IPv4(10, 9, 0, 1), Port: 40000}})
			close(served)
		}()
		defer func() { a.Close(); <-served }()
		a.SetDeadline(time.Now().Add(5 * time.Second)) // safety net only
		go a.Write(protocol.AppendFrame(nil, 0, 1, &protocol.Hello{
			ProtocolVersion: uint16(version), User: user, Credentials: cred, ClientName: clientName}))
		fr, _, err := protocol.ReadFrame(bufio.NewReader(a), 1<<20, nil)
		if err != nil {
			t.Fatalf("no answer to HELLO: %v", err)
		}
		body, err := protocol.Decode(fr)
		if err != nil {
			t.Fatalf("answer does not decode: %v", err)
		}
		valid := utf8.ValidString(user) && utf8.ValidString(cred) && utf8.ValidString(clientName) &&
			version == protocol.Version
		right := valid && ((user == "alice" && cred == password) || (user == "" && cred == token))
		switch v := body.(type) {
		case *protocol.HelloOK:
			if !right {
				t.Fatalf("HELLO user %q credentials %q admitted", user, cred)
			}
		case *protocol.ErrorBody:
			if right || !v.Fatal {
				t.Fatalf("HELLO user %q credentials %q: %+v", user, cred, v)
			}
			if valid && v.Code != protocol.CodeAuthFailed {
				t.Fatalf("HELLO user %q credentials %q: %s, want auth_failed", user, cred, v.Code)
			}
			// Refused: the server closes the connection.
			if _, err := io.Copy(io.Discard, a); err != nil {
				t.Fatalf("connection not closed after a fatal error: %v", err)
			}
		default:
			t.Fatalf("answer %T", body)
		}
	})
}
