package session_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/protocol"
)

// With ReconnectGraceMsLive the registry reads the grace at each disconnect:
// a change applies to the next disconnect, a dormant session keeps its timer,
// 0 cleans up at once, and ReconnectGraceMs reports the live value.
func TestLiveGraceReadAtEachDisconnect(t *testing.T) {
	var graceMs atomic.Int64
	graceMs.Store(5000)
	fx := &fixture{t: t, fake: sessiontest.New(), timers: &timers{}}
	reg, err := session.NewRegistry(session.Config{
		Backend: fx.fake, OwnerID: "owner-a", Rand: &counter{}, ReconnectGraceMs: 1,
		ReconnectGraceMsLive: graceMs.Load, AfterFunc: fx.timers.after,
	})
	if err != nil {
		t.Fatal(err)
	}
	fx.reg = reg
	if got := reg.ReconnectGraceMs(); got != 5000 {
		t.Fatalf("ReconnectGraceMs %d, want the live 5000 over the static 1", got)
	}
	lastTimer := func() time.Duration {
		fx.timers.mu.Lock()
		defer fx.timers.mu.Unlock()
		return fx.timers.fns[len(fx.timers.fns)-1].d
	}

	k1 := &sink{}
	s1, _ := fx.open(protocol.ResumeIdentity{}, k1)
	s1.Detach(k1, nil)
	if d := lastTimer(); d != 5*time.Second {
		t.Fatalf("first grace %v", d)
	}

	graceMs.Store(200)
	if got := reg.ReconnectGraceMs(); got != 200 {
		t.Fatalf("ReconnectGraceMs after the change %d", got)
	}
	k2 := &sink{}
	s2, _ := fx.open(protocol.ResumeIdentity{}, k2)
	s2.Detach(k2, nil)
	if d := lastTimer(); d != 200*time.Millisecond {
		t.Fatalf("grace after the change %v, want 200ms", d)
	}
	if n := len(fx.timers.fns); n != 2 {
		t.Fatalf("%d timers: the change restarted a dormant session's timer", n)
	}

	graceMs.Store(0)
	k3 := &sink{}
	s3, _ := fx.open(protocol.ResumeIdentity{}, k3)
	s3.Detach(k3, nil)
	if info := s3.Info(); !info.Closed {
		t.Fatalf("grace 0: session %+v, want cleaned up at once", info)
	}
	if n := len(fx.timers.fns); n != 2 {
		t.Fatalf("grace 0 started a timer")
	}
	// Both earlier sessions are still dormant and resumable.
	if _, out := fx.open(s1.Identity(), &sink{}); out != protocol.ResumeResumed {
		t.Fatalf("resume of the first session: %v", out)
	}
	if st := reg.Stats(); st.GraceEntered != 2 {
		t.Fatalf("grace entered %d, want 2", st.GraceEntered)
	}
}
