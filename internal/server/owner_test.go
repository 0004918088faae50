package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/session/bridge"
	"github.com/sinewmq/sinew/internal/sessionstore"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// ownedBroker is one process lifetime of a real broker with a session store
// on a shared MemFS, so a test can restart it as sinew serve would.
type ownedBroker struct {
	t    *testing.T
	addr string
	stop func()
}

func startOwnedBroker(t *testing.T, fsys *vfs.MemFS, users *auth.Users) *ownedBroker {
	t.Helper()
	b, err := broker.Open(broker.Config{DataDir: "/data", FS: fsys, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sessionstore.Open(sessionstore.Options{FS: fsys, Dir: "/data/sessions"})
	if err != nil {
		t.Fatal(err)
	}
	// Grace timers never fire: sessions stay resumable for the whole test.
	never := func(time.Duration, func()) func() bool { return func() bool { return true } }
	srv, err := New(Config{Backend: bridge.New(b), OwnerID: "owner-test", Rand: rand.Reader, Users: users,
		AuthTokens: []string{"machine"}, AuthFailureDelayMs: -1, SessionStore: st,
		ReconnectGraceMs: 60_000, RestartGraceMs: 60_000, AfterFunc: never})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	ob := &ownedBroker{t: t, addr: ln.Addr().String()}
	stopped := false
	ob.stop = func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("serve returned %v", err)
		}
		if err := st.Close(); err != nil {
			t.Errorf("session store close: %v", err)
		}
		if err := b.Close(); err != nil {
			t.Errorf("broker close: %v", err)
		}
	}
	t.Cleanup(ob.stop)
	return ob
}

// helloAs opens a connection, says HELLO with h and returns HELLO_OK; the
// connection is closed when the test ends or by the caller.
func (ob *ownedBroker) helloAs(h protocol.Hello) (*client, *protocol.HelloOK) {
	ob.t.Helper()
	nc, err := net.Dial("tcp", ob.addr)
	if err != nil {
		ob.t.Fatal(err)
	}
	c := wrap(ob.t, nc)
	return c, c.hello(h)
}

// TestResumeBelongsToItsPrincipal: a session resumes only for the principal
// that opened it. Another user, or a token, presenting the right client id
// and token gets resume_rejected and a fresh session of its own, while the
// owner still resumes, before a broker restart and after it (the session
// store records the owner).
func TestResumeBelongsToItsPrincipal(t *testing.T) {
	fsys := vfs.NewMem()
	if err := fsys.MkdirAll("/data", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fsys.SyncDir("/"); err != nil {
		t.Fatal(err)
	}
	users, err := auth.OpenUsersParams(fsys, broker.UsersPath("/data"), cheapHash)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"alice", "bob"} {
		if err := users.Add(n, "password-"+n, auth.Permissions{}); err != nil {
			t.Fatal(err)
		}
	}
	alice := protocol.Hello{User: "alice", Credentials: "password-alice"}
	bob := protocol.Hello{User: "bob", Credentials: "password-bob"}
	token := protocol.Hello{Credentials: "machine"}
	as := func(h protocol.Hello, id protocol.ResumeIdentity) protocol.Hello { h.Resume = id; return h }

	ob := startOwnedBroker(t, fsys, users)
	c, ok := ob.helloAs(alice)
	id := ok.Resume
	c.nc.Close()

	check := func(when, who string, h protocol.Hello, want protocol.ResumeOutcome) {
		t.Helper()
		c, ok := ob.helloAs(as(h, id))
		if ok.Outcome != want {
			t.Fatalf("%s: %s presenting alice's session got %s, want %s", when, who, ok.Outcome, want)
		}
		if want == protocol.ResumeRejected && ok.Resume.ClientID == id.ClientID {
			t.Fatalf("%s: a rejected resume was handed alice's session %s", when, id.ClientID)
		}
		if want == protocol.ResumeResumed {
			id = ok.Resume
		}
		c.nc.Close()
	}
	check("live", "bob", bob, protocol.ResumeRejected)
	check("live", "a token", token, protocol.ResumeRejected)
	check("live", "alice", alice, protocol.ResumeResumed)

	// The token is 256 bits (crypto/rand in production; Rand here too),
	// and the session store holds only its SHA-256.
	if len(id.Token) < 16 {
		t.Fatalf("resume token of %d bytes, want at least 128 bits", len(id.Token))
	}
	ob.stop()
	hash := sha256.Sum256(id.Token)
	var raw, hashed bool
	walkFiles(t, fsys, "/data/sessions", func(b []byte) {
		raw = raw || bytes.Contains(b, id.Token)
		hashed = hashed || bytes.Contains(b, hash[:])
	})
	if raw || !hashed {
		t.Fatalf("session store: raw token present %v, token hash present %v; want only the hash", raw, hashed)
	}
	ob = startOwnedBroker(t, fsys, users)
	check("after restart", "bob", bob, protocol.ResumeRejected)
	check("after restart", "alice", alice, protocol.ResumeResumed)
}

// walkFiles calls fn with the contents of every file under dir.
func walkFiles(t *testing.T, fsys *vfs.MemFS, dir string, fn func([]byte)) {
	t.Helper()
	names, err := fsys.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		p := dir + "/" + n
		fi, err := fsys.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.IsDir() {
			walkFiles(t, fsys, p, fn)
			continue
		}
		b, err := fsys.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		fn(b)
	}
}
