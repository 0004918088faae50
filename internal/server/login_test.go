package server

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// answers records the first frame each watched client gets: the error code,
// or CodeOK for HELLO_OK.
type answers struct {
	mu  sync.Mutex
	got map[string]protocol.Code
}

func (a *answers) watch(name string, c *client) {
	go func() {
		_, b, err := c.tryRead()
		if err != nil {
			return
		}
		code := protocol.CodeOK
		if e, ok := b.(*protocol.ErrorBody); ok {
			code = e.Code
		}
		a.mu.Lock()
		if a.got == nil {
			a.got = map[string]protocol.Code{}
		}
		a.got[name] = code
		a.mu.Unlock()
	}()
}

func (a *answers) of(name string) (protocol.Code, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.got[name]
	return c, ok
}

// Token checks from one source address run one at a time, and a wrong one
// holds its address through the failure delay, like a password check: a
// second wrong token from the same address is answered only after the
// first's delay, while another address is not held up (fake clock).
func TestTokenGuessesThrottledPerAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPipeServer(t, func(c *Config) {
			c.AuthTokens, c.AuthFailureDelayMs, c.HandshakeTimeoutMs = []string{"right-token-0123456789abcdef0123456789"}, 1000, 5000
		})
		wrong := protocol.Hello{ProtocolVersion: protocol.Version, Credentials: "wrong-token"}
		var a answers
		for _, n := range []struct{ name, ip string }{{"first", "10.0.0.9"}, {"second", "10.0.0.9"}, {"other", "10.0.0.3"}} {
			c := p.dialFrom(n.ip)
			c.send(0, &wrong)
			a.watch(n.name, c)
			synctest.Wait()
		}
		time.Sleep(time.Second)
		synctest.Wait()
		for _, name := range []string{"first", "other"} {
			if code, ok := a.of(name); !ok || code != protocol.CodeAuthFailed {
				t.Fatalf("%s after one delay: %v %v, want auth_failed", name, code, ok)
			}
		}
		if _, ok := a.of("second"); ok {
			t.Fatal("a second wrong token from the address was answered within the first's delay")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if code, ok := a.of("second"); !ok || code != protocol.CodeAuthFailed {
			t.Fatalf("second after two delays: %v %v", code, ok)
		}
		p.dialFrom("10.0.0.9").hello(protocol.Hello{Credentials: "right-token-0123456789abcdef0123456789"})
		if n := p.srv.logins.Len(); n != 0 {
			t.Fatalf("%d login lanes left", n)
		}
		p.shutdown()
	})
}

// A password check waits for a hash slot only until its handshake deadline:
// with every slot busy, the login then gets a fatal, retryable
// handshake_timeout saying the broker is busy, at once and not as a failed
// login (not counted, no failure delay), and the login that held the slot
// still gets in.
func TestLoginHashWaitEndsAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		held := make(chan struct{}, 1)
		var once sync.Once
		users, err := auth.OpenUsersWith(vfs.NewMem(), "/data/meta/users", auth.UsersOptions{
			Params: cheapHash, HashesMax: 1,
			OnHash: func() {
				first := false
				once.Do(func() { first = true })
				if first {
					return // Add's hash
				}
				select {
				case held <- struct{}{}:
					<-hold
				default:
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := users.Add("alice", "correct horse", auth.Permissions{}); err != nil {
			t.Fatal(err)
		}
		p := newPipeServer(t, func(c *Config) {
			c.Users, c.AuthFailureDelayMs, c.HandshakeTimeoutMs = users, 1000, 5000
		})
		var a answers
		holder := p.dialFrom("10.0.0.1")
		holder.send(0, &protocol.Hello{ProtocolVersion: protocol.Version, User: "alice", Credentials: "correct horse"})
		a.watch("holder", holder)
		<-held
		waiter := p.dialFrom("10.0.0.2")
		waiter.send(0, &protocol.Hello{ProtocolVersion: protocol.Version, User: "alice", Credentials: "wrong password"})
		a.watch("waiter", waiter)
		synctest.Wait()
		if _, ok := a.of("waiter"); ok {
			t.Fatal("answered while a slot could still come free")
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if code, ok := a.of("waiter"); !ok || code != protocol.CodeHandshakeTimeout || !code.Retryable() {
			t.Fatalf("login whose hash wait passed the deadline: %v %v, want handshake_timeout", code, ok)
		}
		if st := p.srv.Stats(); st.AuthFailures != 0 {
			t.Fatalf("a login that was never checked counted as %d auth failures", st.AuthFailures)
		}
		close(hold)
		synctest.Wait()
		if code, ok := a.of("holder"); !ok || code != protocol.CodeOK {
			t.Fatalf("holder: %v %v, want HELLO_OK", code, ok)
		}
		p.shutdown()
	})
}
