package main

import (
	"bufio"
	"testing"

	"github.com/sinewmq/sinew/protocol"
)

// TestDedupSettingsReachPartitions: limits.dedup_producers_max set to 1 in
// serve's configuration bounds the real partitions' windows, and /metrics
// counts the evictions and duplicates.
func TestDedupSettingsReachPartitions(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.Limits.DedupProducersMax = 1
	addr, adminAddr, _ := runServeAdmin(t, cfg)
	nc, _ := hello(t, addr, protocol.ResumeIdentity{})
	br := bufio.NewReader(nc)
	reqID := uint64(1)
	publish := func(producer string, seq uint64) *protocol.PublishOK {
		t.Helper()
		reqID++
		p := &protocol.Publish{Topic: "dedup-limits", Partition: 0, Body: []byte("x"), ProducerID: producer, ProducerSeq: seq}
		if _, err := nc.Write(protocol.AppendFrame(nil, 0, reqID, p)); err != nil {
			t.Fatal(err)
		}
		for {
			f, _, err := protocol.ReadFrame(br, 1<<21, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := protocol.Decode(f)
			if err != nil {
				t.Fatal(err)
			}
			switch b := body.(type) {
			case *protocol.Ping:
			case *protocol.PublishOK:
				return b
			default:
				t.Fatalf("publish %s/%d: %s %+v", producer, seq, f.Op, b)
			}
		}
	}
	first := publish("a", 1)
	publish("b", 1) // a is forgotten: the window holds one producer
	if again := publish("a", 1); again.Duplicate {
		t.Fatalf("a forgotten producer's resend answered as a duplicate of %d", again.Offset)
	} else if again.Offset == first.Offset {
		t.Fatalf("stored again at the same offset %d", again.Offset)
	}
	if dup := publish("a", 1); !dup.Duplicate {
		t.Fatalf("resend of the remembered producer: %+v, want duplicate", dup)
	}
	// A fence: the partition publishes its counters at the end of each
	// turn, so once this later publish is answered the turn that answered
	// the duplicate has published them.
	publish("a", 2)
	samples, _ := scrape(t, adminAddr)
	for series, want := range map[string]float64{
		`sinew_queue_dedup_evicted_limit_total{group="",partition="0",topic="dedup-limits"}`: 2,
		`sinew_queue_dedup_evicted_idle_total{group="",partition="0",topic="dedup-limits"}`:  0,
		`sinew_queue_dedup_producers{group="",partition="0",topic="dedup-limits"}`:           1,
		`sinew_queue_publish_duplicates_total{group="",partition="0",topic="dedup-limits"}`:  1,
	} {
		if got, ok := samples[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
}
