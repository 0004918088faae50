package e2e_test

import (
	"fmt"
	"testing"

	"go.uber.org/goleak"

	"github.com/sinewmq/sinew/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func body(s string) []byte { return []byte(s) }

func TestSettleKinds(t *testing.T) {
	n := startNode(t, t.TempDir(), nil)
	c := dial(t, n.addr)
	c.declare(&protocol.DeclareQueue{Topic: "jobs", MaxRetries: 3})
	for _, s := range []string{"ack-me", "nack-me", "fail-me"} {
		c.publish(&protocol.Publish{Topic: "jobs", Partition: -1, Body: body(s)})
	}
	sub := c.subscribe(&protocol.Subscribe{Topic: "jobs", Partition: -1, Prefetch: 10})
	got := map[string]*protocol.Deliver{}
	for range 3 {
		d := c.next()
		if d.SubID != sub.SubID || d.Attempt != 1 {
			t.Fatalf("delivery %+v", d)
		}
		got[string(d.Body)] = d
	}
	if codes := c.settle(protocol.OpAck, 0, got["ack-me"].Tag); codes[0] != protocol.CodeOK {
		t.Fatalf("ack %v", codes)
	}
	if codes := c.settle(protocol.OpNack, 0, got["nack-me"].Tag); codes[0] != protocol.CodeOK {
		t.Fatalf("nack %v", codes)
	}
	again := c.next()
	if string(again.Body) != "nack-me" || again.Attempt != 2 || again.Offset != got["nack-me"].Offset {
		t.Fatalf("redelivery %+v", again)
	}
	if codes := c.settle(protocol.OpFail, 0, got["fail-me"].Tag); codes[0] != protocol.CodeOK {
		t.Fatalf("fail %v", codes)
	}
	if codes := c.settle(protocol.OpAck, 0, again.Tag); codes[0] != protocol.CodeOK {
		t.Fatalf("ack %v", codes)
	}
	// Repeating a settle of the same lease the same way returns the original
	// outcome (docs/protocol.md 5.9), so a client may resend one whose reply
	// was lost.
	if codes := c.settle(protocol.OpAck, 0, got["ack-me"].Tag); codes[0] != protocol.CodeOK {
		t.Fatalf("second ack %v", codes)
	}
	c.quiet()
	// FAIL dead-letters into the global dead-letter queue, with its origin in
	// reserved headers.
	dlq := dial(t, n.addr)
	dlq.subscribe(&protocol.Subscribe{Topic: "sinew.dead-letter", Partition: -1, Prefetch: 10})
	d := dlq.next()
	if string(d.Body) != "fail-me" || header(d, "sinew.source.topic") != "jobs" || header(d, "sinew.reason") == "" {
		t.Fatalf("dead letter %+v", d)
	}
}

func TestPrefetchAndCompetingConsumers(t *testing.T) {
	n := startNode(t, t.TempDir(), nil)
	p := dial(t, n.addr)
	for i := range 20 {
		p.publish(&protocol.Publish{Topic: "work", Partition: -1, Body: body(fmt.Sprint(i))})
	}
	a, b := dial(t, n.addr), dial(t, n.addr)
	a.subscribe(&protocol.Subscribe{Topic: "work", Partition: -1, Prefetch: 3})
	b.subscribe(&protocol.Subscribe{Topic: "work", Partition: -1, Prefetch: 2})
	held := map[*client][]*protocol.Deliver{}
	for range 3 {
		held[a] = append(held[a], a.next())
	}
	for range 2 {
		held[b] = append(held[b], b.next())
	}
	a.quiet() // prefetch 3: nothing beyond three until one is settled
	b.quiet()
	seen := map[string]int{}
	for len(seen) < 20 {
		for _, c := range []*client{a, b} {
			if len(held[c]) == 0 {
				continue
			}
			d := held[c][0]
			held[c] = held[c][1:]
			seen[string(d.Body)]++
			if codes := c.settle(protocol.OpAck, 0, d.Tag); codes[0] != protocol.CodeOK {
				t.Fatalf("ack %v", codes)
			}
			if len(seen)+len(held[a])+len(held[b]) < 20 {
				held[c] = append(held[c], c.next())
			}
		}
	}
	for body, k := range seen {
		if k != 1 {
			t.Fatalf("message %s delivered %d times", body, k)
		}
	}
	a.quiet()
	b.quiet()
}

func TestLeaseExpiryRedelivers(t *testing.T) {
	n := startNode(t, t.TempDir(), nil)
	a := dial(t, n.addr)
	a.declare(&protocol.DeclareQueue{Topic: "slow", LeaseMs: 200, MaxRetries: -1})
	a.publish(&protocol.Publish{Topic: "slow", Partition: -1, Body: body("m")})
	a.subscribe(&protocol.Subscribe{Topic: "slow", Partition: -1, Prefetch: 1})
	first := a.next()
	// a never settles. Its unsettled delivery still counts against its prefetch,
	// so once the lease runs out the message goes to the other consumer.
	b := dial(t, n.addr)
	b.subscribe(&protocol.Subscribe{Topic: "slow", Partition: -1, Prefetch: 1})
	second := b.next()
	if second.Offset != first.Offset || second.Attempt != 2 {
		t.Fatalf("redelivery %+v after %+v", second, first)
	}
	if codes := a.settle(protocol.OpAck, 0, first.Tag); codes[0] != protocol.CodeStaleLease {
		t.Fatalf("settle of the expired lease: %v", codes)
	}
	if codes := b.settle(protocol.OpAck, 0, second.Tag); codes[0] != protocol.CodeOK {
		t.Fatalf("ack %v", codes)
	}
	a.quiet()
	b.quiet()
}

func TestDelayAndTTL(t *testing.T) {
	n := startNode(t, t.TempDir(), nil)
	c := dial(t, n.addr)
	// Expires (TTL 50 ms) before it is due (delay 300 ms): never delivered.
	c.publish(&protocol.Publish{Topic: "timed", Partition: -1, DelayMs: 300, TTLMs: 50, Body: body("expired")})
	c.publish(&protocol.Publish{Topic: "timed", Partition: -1, DelayMs: 400, Body: body("delayed")})
	c.publish(&protocol.Publish{Topic: "timed", Partition: -1, Body: body("now")})
	c.subscribe(&protocol.Subscribe{Topic: "timed", Partition: -1, Prefetch: 10})
	if d := c.next(); string(d.Body) != "now" {
		t.Fatalf("first delivery %q, want the undelayed one", d.Body)
	}
	d := c.next()
	if string(d.Body) != "delayed" {
		t.Fatalf("second delivery %q, want the delayed one (the expired one must never come)", d.Body)
	}
	// NACK with a delay: the message comes back, later.
	if codes := c.settle(protocol.OpNack, 200, d.Tag); codes[0] != protocol.CodeOK {
		t.Fatalf("nack %v", codes)
	}
	if again := c.next(); string(again.Body) != "delayed" || again.Attempt != 2 {
		t.Fatalf("redelivery %+v", again)
	}
}

func TestMaxRetriesDeadLetters(t *testing.T) {
	n := startNode(t, t.TempDir(), nil)
	c := dial(t, n.addr)
	c.declare(&protocol.DeclareQueue{Topic: "flaky", MaxRetries: 1, DeadLetterMode: protocol.DeadLetterQueue, DeadLetterTarget: "flaky-dlq"})
	c.publish(&protocol.Publish{Topic: "flaky", Partition: -1, Body: body("poison")})
	c.subscribe(&protocol.Subscribe{Topic: "flaky", Partition: -1, Prefetch: 1})
	for attempt := uint32(1); attempt <= 2; attempt++ {
		d := c.next()
		if d.Attempt != attempt {
			t.Fatalf("attempt %d, want %d", d.Attempt, attempt)
		}
		if codes := c.settle(protocol.OpNack, 0, d.Tag); codes[0] != protocol.CodeOK {
			t.Fatalf("nack %v", codes)
		}
	}
	c.quiet()
	dlq := dial(t, n.addr)
	dlq.subscribe(&protocol.Subscribe{Topic: "flaky-dlq", Partition: -1, Prefetch: 1})
	if d := dlq.next(); string(d.Body) != "poison" || header(d, "sinew.retries") == "" {
		t.Fatalf("dead letter %+v", d)
	}
}

func TestPartitions(t *testing.T) {
	n := startNode(t, t.TempDir(), nil)
	c := dial(t, n.addr)
	if ok := c.declare(&protocol.DeclareQueue{Topic: "parts", Partitions: 4, MaxRetries: -1}); ok.Partitions != 4 {
		t.Fatalf("declare %+v", ok)
	}
	byKey := map[string]uint32{}
	for i := range 40 {
		key := fmt.Sprint("k", i%5)
		ok := c.publish(&protocol.Publish{Topic: "parts", Partition: -1, Key: body(key), Body: body(fmt.Sprint(i))})
		if p, seen := byKey[key]; seen && p != ok.Partition {
			t.Fatalf("key %s went to partitions %d and %d", key, p, ok.Partition)
		}
		byKey[key] = ok.Partition
	}
	explicit := c.publish(&protocol.Publish{Topic: "parts", Partition: 3, Body: body("p3")})
	if explicit.Partition != 3 {
		t.Fatalf("explicit partition %d", explicit.Partition)
	}
	// One subscription per partition sees only its partition, in offset order.
	total := 0
	for p := range int32(4) {
		sc := dial(t, n.addr)
		sub := sc.subscribe(&protocol.Subscribe{Topic: "parts", Partition: p, Prefetch: 100})
		if len(sub.Partitions) != 1 || sub.Partitions[0] != uint32(p) {
			t.Fatalf("SUBSCRIBE_OK %+v", sub)
		}
		want := 0
		for _, kp := range byKey {
			if kp == uint32(p) {
				want += 8
			}
		}
		if p == 3 {
			want++
		}
		var last uint64
		for i := range want {
			d := sc.next()
			if d.Partition != uint32(p) || (i > 0 && d.Offset <= last) {
				t.Fatalf("partition %d got %+v after offset %d", p, d, last)
			}
			last = d.Offset
		}
		sc.quiet()
		total += want
	}
	if total != 41 {
		t.Fatalf("delivered %d, want 41", total)
	}
}

func TestAcksSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, dir, nil)
	c := dial(t, n.addr)
	for i := range 6 {
		c.publish(&protocol.Publish{Topic: "durable", Partition: -1, Body: body(fmt.Sprint(i))})
	}
	c.subscribe(&protocol.Subscribe{Topic: "durable", Partition: -1, Prefetch: 6})
	var tags []uint64
	acked := map[string]bool{}
	for range 6 {
		d := c.next()
		if d.Offset%2 == 0 {
			tags = append(tags, d.Tag)
			acked[string(d.Body)] = true
		}
	}
	if codes := c.settle(protocol.OpAck, 0, tags...); len(codes) != 3 || codes[0]|codes[1]|codes[2] != protocol.CodeOK {
		t.Fatalf("acks %v", codes)
	}
	c.nc.Close()

	n = n.restart()
	c = dial(t, n.addr)
	c.subscribe(&protocol.Subscribe{Topic: "durable", Partition: -1, Prefetch: 10})
	for range 3 {
		d := c.next()
		if acked[string(d.Body)] {
			t.Fatalf("acked message %q came back after restart", d.Body)
		}
	}
	c.quiet()
}
