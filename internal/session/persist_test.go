package session_test

import (
	"crypto/sha256"
	"testing"

	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/internal/sessionstore"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

func openStore(t *testing.T, fsys vfs.FS) *sessionstore.Store {
	t.Helper()
	// The data dir exists and is durable, as sinew serve leaves it.
	if err := fsys.MkdirAll("/data", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fsys.SyncDir("/"); err != nil {
		t.Fatal(err)
	}
	st, err := sessionstore.Open(sessionstore.Options{FS: fsys, Dir: "/data/sessions"})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func newStoreFixture(t *testing.T, st *sessionstore.Store, graceMs int64) *fixture {
	fx := &fixture{t: t, fake: sessiontest.New(), timers: &timers{}}
	reg, err := session.NewRegistry(session.Config{
		Backend: fx.fake, OwnerID: "owner-a", Rand: &counter{}, ReconnectGraceMs: graceMs,
		AfterFunc: fx.timers.after, SubscriptionsMax: 4, Store: st,
	})
	if err != nil {
		t.Fatal(err)
	}
	fx.reg = reg
	return fx
}

// TestStoreRecordsLifecycle checks what the registry writes to the session
// store: a session at its creation with the hash of its token, a
// subscription at SUBSCRIBE with its stable identity, its removal at
// UNSUBSCRIBE, and the session's removal when it ends (here: a disconnect
// without grace, and END_SESSION).
func TestStoreRecordsLifecycle(t *testing.T) {
	fsys := vfs.NewMem()
	st := openStore(t, fsys)
	fx := newStoreFixture(t, st, 1000)

	k1, k2, k3 := &sink{}, &sink{}, &sink{}
	s1, _ := fx.open(protocol.ResumeIdentity{}, k1)
	s2, _ := fx.open(protocol.ResumeIdentity{}, k2)
	s3, _ := fx.open(protocol.ResumeIdentity{}, k3)
	a := subscribe(t, s1, k1, protocol.Subscribe{Topic: "t", Group: "g", Partition: -1, AckMode: protocol.AckManual, Prefetch: 7})
	k1.take()
	b := subscribe(t, s1, k1, protocol.Subscribe{Topic: "u", Partition: -1, AckMode: protocol.AckAuto, Prefetch: 3})
	subscribe(t, s2, k2, protocol.Subscribe{Topic: "t", Group: "g", Partition: -1, Prefetch: 1})
	if err := s1.Unsubscribe(b); err != nil {
		t.Fatal(err)
	}
	s2.End(k2)
	s3.Detach(k3, nil) // dormant: still recorded
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	re := openStore(t, fsys)
	defer re.Close()
	got := map[string]sessionstore.Session{}
	for _, x := range re.Restored() {
		got[x.ClientID] = x
	}
	if len(got) != 2 {
		t.Fatalf("store holds %d sessions, want 2 (s1, dormant s3): %+v", len(got), got)
	}
	r1, ok := got[s1.ClientID()]
	if !ok {
		t.Fatalf("s1 not in the store")
	}
	if _, ok := got[s3.ClientID()]; !ok {
		t.Fatalf("dormant s3 not in the store")
	}
	if r1.OwnerID != "owner-a" || r1.TokenHash != sha256.Sum256(s1.Identity().Token) {
		t.Fatalf("s1 recorded as owner %q hash %x; want owner-a and the token's hash", r1.OwnerID, r1.TokenHash)
	}
	want := sessionstore.Sub{ID: a, Topic: "t", Group: "g", Partition: -1, AckMode: protocol.AckManual, Prefetch: 7}
	if len(r1.Subs) != 1 || r1.Subs[0] != want {
		t.Fatalf("s1 subscriptions %+v, want [%+v]", r1.Subs, want)
	}
	if re.NextSubID() <= b {
		t.Fatalf("next subscription id %d would reuse %d", re.NextSubID(), b)
	}
}

// TestPersistForRestartKeepsSessions checks that after PersistForRestart the
// cleanup of shutdown neither records session ends nor closes subscriptions
// (their leases stay for the restarted broker), while a client's own
// END_SESSION still counts.
func TestPersistForRestartKeepsSessions(t *testing.T) {
	fsys := vfs.NewMem()
	st := openStore(t, fsys)
	fx := newStoreFixture(t, st, 0)
	fx.publish("t", 3)

	k1, k2 := &sink{}, &sink{}
	s1, _ := fx.open(protocol.ResumeIdentity{}, k1)
	s2, _ := fx.open(protocol.ResumeIdentity{}, k2)
	subscribe(t, s1, k1, protocol.Subscribe{Topic: "t", Partition: -1, AckMode: protocol.AckManual, Prefetch: 2})
	subscribe(t, s2, k2, protocol.Subscribe{Topic: "u", Partition: -1, AckMode: protocol.AckManual, Prefetch: 2})
	if _, inflight, _, _ := fx.fake.Counts("t", ""); inflight != 2 {
		t.Fatalf("inflight %d before shutdown, want 2", inflight)
	}

	if err := fx.reg.PersistForRestart(); err != nil {
		t.Fatal(err)
	}
	s2.End(k2)     // the client's own end still counts
	fx.reg.Drain() // as Server.Shutdown does
	fx.reg.CloseAll()
	if _, inflight, _, _ := fx.fake.Counts("t", ""); inflight != 2 {
		t.Fatalf("inflight %d after shutdown, want 2: the leases stay for the restart", inflight)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// What survives a power cut right after Close: everything.
	re := openStore(t, fsys.Crash(nil, false))
	defer re.Close()
	rs := re.Restored()
	if len(rs) != 1 || rs[0].ClientID != s1.ClientID() || len(rs[0].Subs) != 1 {
		t.Fatalf("restored %+v, want only s1 with its subscription", rs)
	}
}
