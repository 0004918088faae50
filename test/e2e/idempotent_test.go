package e2e_test

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/protocol"
)

// firstSegmentLSN returns the first LSN of the oldest log segment of the
// only queue in dir.
func firstSegmentLSN(t *testing.T, dir string) uint64 {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "queues", "*", "*", "p0", "log", "*.seg"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segments under %s: %v", dir, err)
	}
	slices.Sort(segs)
	lsn, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(segs[0]), ".seg"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// TestIdempotentResendAcrossRestarts runs a real `sinew serve`. One
// producer sequence is stored and acked, a megabyte and a half of acked
// messages follow, and a second sequence is stored and left unacked. After
// a kill -9 and a restart, resends of both get their original offsets with
// duplicate = true. After a clean stop (which checkpoints, and retention
// drops the segment holding the acked original) and another restart, they
// still do, and the queue holds one copy of the unacked message.
func TestIdempotentResendAcrossRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	dir := t.TempDir()
	const topic = "idem"
	pub := func(body string, seq uint64) *protocol.Publish {
		return &protocol.Publish{Topic: topic, Partition: -1, Body: []byte(body), ProducerID: "app", ProducerSeq: seq}
	}

	srv := startChildArgs(t, bin, dir, "--storage-segment-bytes", strconv.Itoa(1<<20))
	c := dial(t, srv.addr)
	first := c.publish(pub("first", 1))
	if first.Duplicate {
		t.Fatal("first publish answered as a duplicate")
	}
	sub := c.subscribe(&protocol.Subscribe{Topic: topic, Partition: -1, Prefetch: 64})
	filler := strings.Repeat("f", 32<<10)
	const fillers = 48 // 1.5 MiB: the log rolls past the first segment
	for range fillers {
		c.publish(&protocol.Publish{Topic: topic, Partition: -1, Body: []byte(filler)})
	}
	for range fillers + 1 {
		d := c.next()
		if codes := c.settle(protocol.OpAck, 0, d.Tag); codes[0] != protocol.CodeOK {
			t.Fatalf("ack of offset %d: %v", d.Offset, codes[0])
		}
	}
	// Unsubscribed, so the second message is not leased when the broker dies.
	if r, ok := c.call(&protocol.Unsubscribe{SubID: sub.SubID}).(*protocol.OK); !ok {
		t.Fatalf("unsubscribe: %+v", r)
	}
	second := c.publish(pub("second", 2))
	if second.Duplicate || second.Offset <= first.Offset {
		t.Fatalf("second publish: %+v", second)
	}
	if err := srv.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	<-srv.done
	srv.cmd.Wait()

	resend := func(addr, when string) {
		t.Helper()
		c := dial(t, addr)
		for _, want := range []struct {
			body string
			seq  uint64
			ok   *protocol.PublishOK
		}{{"first", 1, first}, {"second", 2, second}} {
			got := c.publish(pub(want.body+" resent", want.seq))
			if !got.Duplicate || got.Offset != want.ok.Offset || got.Partition != want.ok.Partition {
				t.Fatalf("%s: resend of sequence %d = %+v, want offset %d with duplicate", when, want.seq, got, want.ok.Offset)
			}
		}
	}
	srv = startChildArgs(t, bin, dir, "--storage-segment-bytes", strconv.Itoa(1<<20))
	resend(srv.addr, "after kill -9")
	stopChild(t, srv) // checkpoints; retention drops the first segment

	if lsn := firstSegmentLSN(t, dir); lsn <= first.Offset {
		t.Fatalf("the log still starts at lsn %d, at or before the acked original at %d", lsn, first.Offset)
	}
	srv = startChildArgs(t, bin, dir, "--storage-segment-bytes", strconv.Itoa(1<<20))
	resend(srv.addr, "after its segment was dropped")
	d := dial(t, srv.addr)
	d.subscribe(&protocol.Subscribe{Topic: topic, Partition: -1, Prefetch: 64})
	m := d.next()
	if m.Offset != second.Offset || string(m.Body) != "second" {
		t.Fatalf("delivered offset %d %q, want the unacked original %d", m.Offset, m.Body, second.Offset)
	}
	d.quiet() // and nothing else: no resend was stored
	stopChild(t, srv)
}
