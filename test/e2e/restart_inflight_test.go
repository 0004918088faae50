package e2e_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/internal/sessionstore"
	"github.com/sinewmq/sinew/protocol"
)

// storeNode starts an in-process node on dir with a session store and a
// restart window of a minute; stop it with stopStoreNode.
func storeNode(t *testing.T, dir, addr string) (*node, *sessionstore.Store) {
	t.Helper()
	st, err := sessionstore.Open(sessionstore.Options{Dir: dir + "/sessions"})
	if err != nil {
		t.Fatal(err)
	}
	n := startNodeOpts(t, dir, func(c *broker.Config) { c.RecoveredLeaseGraceMs = 60_000 }, nodeOpts{
		addr:   addr,
		drain:  2 * time.Second, // clients close first; a bound, not a wait
		server: func(c *server.Config) { c.SessionStore, c.RestartGraceMs, c.ReconnectGraceMs = st, 60_000, 5_000 },
	})
	return n, st
}

func stopStoreNode(t *testing.T, n *node, st *sessionstore.Store) {
	t.Helper()
	n.stop()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// helloAs opens a raw connection offering id and returns it with HELLO_OK.
func helloAs(t *testing.T, addr string, id protocol.ResumeIdentity) (*client, *protocol.HelloOK) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &client{t: t, nc: nc, br: bufio.NewReader(nc)}
	c.send(0, &protocol.Hello{ProtocolVersion: protocol.Version, ClientName: "e2e", Resume: id})
	return c, expect[*protocol.HelloOK](c)
}

// TestRestartInflightBindsTags runs the resume of a restored session frame by
// frame against the real broker and server: after a restart the client
// resumes (resumed), RECONCILE keeps its subscription under the same id,
// INFLIGHT reports one of its two held deliveries, which is kept under the
// client's tag (nothing re-sent for it) while the other is re-sent under a
// new tag with the same lease; both ACKs are accepted. A wrong token gets
// resume_rejected.
func TestRestartInflightBindsTags(t *testing.T) {
	dir := t.TempDir()
	n, st := storeNode(t, dir, "")
	addr := n.addr
	c, ok := helloAs(t, addr, protocol.ResumeIdentity{})
	id := ok.Resume
	so := c.subscribe(&protocol.Subscribe{Topic: "rb", Partition: -1, Prefetch: 2})
	p := dial(t, addr)
	p.publish(&protocol.Publish{Topic: "rb", Partition: -1, Body: []byte("one")})
	p.publish(&protocol.Publish{Topic: "rb", Partition: -1, Body: []byte("two")})
	d1, d2 := c.next(), c.next()
	ref := func(d *protocol.Deliver) protocol.LeaseRef {
		return protocol.LeaseRef{SubID: d.SubID, Partition: d.Partition, Offset: d.Offset, LeaseID: d.LeaseID}
	}
	c.nc.Close()
	p.nc.Close()
	stopStoreNode(t, n, st)

	n, st = storeNode(t, dir, addr)
	if s := n.srv.Stats().Sessions; s.Restored != 2 || s.LeasesReclaimed != 2 {
		t.Fatalf("after restart: restored %d sessions, reclaimed %d leases; want 2 and 2", s.Restored, s.LeasesReclaimed)
	}
	bad := id
	bad.Token = append([]byte(nil), id.Token...)
	bad.Token[0] ^= 1
	if _, ok := helloAs(t, addr, bad); ok.Outcome != protocol.ResumeRejected {
		t.Fatalf("wrong token: outcome %v, want resume_rejected", ok.Outcome)
	}

	c, ok = helloAs(t, addr, id)
	if ok.Outcome != protocol.ResumeResumed || ok.Resume.ClientID != id.ClientID {
		t.Fatalf("resume after restart: %+v, want resumed as %s", ok, id.ClientID)
	}
	view := protocol.SubView{SubID: so.SubID, Topic: "rb", Partition: -1, AckMode: protocol.AckManual, Prefetch: 2}
	rr, isRR := c.call(&protocol.Reconcile{Policy: protocol.ReconcileRestore, Subs: []protocol.SubView{view}, InflightFollows: true}).(*protocol.ReconcileResult)
	if !isRR || len(rr.Entries) != 1 || rr.Entries[0].Action != protocol.ActionKeep || rr.Entries[0].ServerSubID != so.SubID {
		t.Fatalf("reconcile after restart: %+v", rr)
	}
	ir, isIR := c.call(&protocol.Inflight{Entries: []protocol.InflightEntry{{Tag: d1.Tag, Lease: ref(d1)}}}).(*protocol.InflightResult)
	if !isIR || ir.Kept != 1 || ir.Resent != 1 || len(ir.Stale) != 0 {
		t.Fatalf("inflight after restart: %+v, want kept 1, resent 1, none stale", ir)
	}
	re := c.next() // written before INFLIGHT_RESULT, so in the backlog
	if string(re.Body) != "two" || re.LeaseID != d2.LeaseID || re.Offset != d2.Offset || re.Attempt != d2.Attempt || re.Tag == d2.Tag {
		t.Fatalf("re-sent %+v; want %q with lease %d under a new tag (old %d)", re, "two", d2.LeaseID, d2.Tag)
	}
	c.quiet()
	r, _ := c.call(&protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{d1.Tag, re.Tag}, Leases: []protocol.LeaseRef{ref(d1), ref(re)}}).(*protocol.SettleResult)
	if r == nil || len(r.Codes) != 2 || r.Codes[0] != protocol.CodeOK || r.Codes[1] != protocol.CodeOK {
		t.Fatalf("acks after restart: %+v, want ok, ok", r)
	}
	if s := n.srv.Stats().Sessions; s.ResumedAfterRestart != 1 {
		t.Fatalf("resumed after restart counted %d, want 1", s.ResumedAfterRestart)
	}
	for _, q := range n.b.Stats().Queues {
		if q.Topic == "rb" && (q.Partitions[0].Inflight != 0 || q.Partitions[0].Ready != 0) {
			t.Fatalf("queue after the acks: %+v, want empty", q.Partitions[0])
		}
	}
	c.nc.Close()
	stopStoreNode(t, n, st)
}

// TestRestartInflightStaleLease: a client holds a delivery whose lease
// expired and whose message went to a newer lease that was ACKed. After a
// restart it resumes and reports that delivery with one it still holds. The
// server asks the partition and lists the first as stale (a settle by its
// lease cannot take effect; the SDK drops such a delivery before the
// application sees it); the second is kept. (Which leases count is
// partition.TestLeaseCurrent.)
func TestRestartInflightStaleLease(t *testing.T) {
	dir := t.TempDir()
	n, st := storeNode(t, dir, "")
	addr := n.addr
	c, ok := helloAs(t, addr, protocol.ResumeIdentity{})
	id := ok.Resume
	c.declare(&protocol.DeclareQueue{Topic: "rs", LeaseMs: 1000, MaxRetries: -1})
	so := c.subscribe(&protocol.Subscribe{Topic: "rs", Partition: -1, Prefetch: 1})
	p := dial(t, addr)
	p.publish(&protocol.Publish{Topic: "rs", Partition: -1, Body: []byte("one")})
	p.publish(&protocol.Publish{Topic: "rs", Partition: -1, Body: []byte("two")})
	d1 := c.next()
	// d1's lease expires; the message comes back under a new lease, which
	// is ACKed.
	again := c.next()
	if again.Offset != d1.Offset || again.LeaseID == d1.LeaseID {
		t.Fatalf("after the expiry got %+v, want offset %d under a new lease", again, d1.Offset)
	}
	if codes := c.settle(protocol.OpAck, 0, again.Tag); codes[0] != protocol.CodeOK {
		t.Fatalf("ack of the new lease: %v", codes)
	}
	// "two" is delivered now; its lease normally still runs at the
	// restart, and the restored session takes it back.
	d2 := c.next()
	if string(d2.Body) != "two" {
		t.Fatalf("second delivery %+v", d2)
	}
	c.nc.Close()
	p.nc.Close()
	stopStoreNode(t, n, st)

	n, st = storeNode(t, dir, addr)
	defer stopStoreNode(t, n, st)
	c, ok = helloAs(t, addr, id)
	if ok.Outcome != protocol.ResumeResumed {
		t.Fatalf("resume after restart: %+v", ok)
	}
	view := protocol.SubView{SubID: so.SubID, Topic: "rs", Partition: -1, AckMode: protocol.AckManual, Prefetch: 1}
	if rr, isRR := c.call(&protocol.Reconcile{Policy: protocol.ReconcileRestore, Subs: []protocol.SubView{view}, InflightFollows: true}).(*protocol.ReconcileResult); !isRR || len(rr.Entries) != 1 || rr.Entries[0].Action != protocol.ActionKeep {
		t.Fatalf("reconcile after restart: %+v", rr)
	}
	ref := func(d *protocol.Deliver) protocol.LeaseRef {
		return protocol.LeaseRef{SubID: d.SubID, Partition: d.Partition, Offset: d.Offset, LeaseID: d.LeaseID}
	}
	ir, isIR := c.call(&protocol.Inflight{Entries: []protocol.InflightEntry{{Tag: d1.Tag, Lease: ref(d1)}, {Tag: d2.Tag, Lease: ref(d2)}}}).(*protocol.InflightResult)
	// Whether or not "two"'s lease outlived the restart, a settle by it
	// can still take effect: it is not stale.
	if !isIR || len(ir.Stale) != 1 || ir.Stale[0] != d1.Tag {
		t.Fatalf("inflight after restart: %+v, want only tag %d (the expired, re-leased and ACKed lease) stale", ir, d1.Tag)
	}
}
