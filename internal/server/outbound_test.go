package server

import (
	"bytes"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/protocol"
)

// TestOutboundCapPausesThenDisconnects drives a consumer that stops reading,
// over net.Pipe (no kernel buffer) in a synctest bubble:
//   - its deliveries stop at the connection's byte cap, with the rest of the
//     backlog left ready in the broker;
//   - once it reads again the writer drains, wakes the session, and the rest
//     arrives;
//   - when it then stops reading for the slow-consumer timeout, it gets a
//     fatal slow_consumer and is closed, and its leases go back to ready.
func TestOutboundCapPausesThenDisconnects(t *testing.T) {
	const (
		capBytes  = 8 << 10
		bodyBytes = 1 << 10
		msgs      = 100
		timeoutMs = 5000
		// frameBytes is what one DELIVER of topic "t" costs in Outbound.Bytes.
		frameBytes = bodyBytes + 1 + 128
	)
	synctest.Test(t, func(t *testing.T) {
		fake := sessiontest.New()
		p := newPipeServer(t, func(c *Config) {
			c.Backend = fake
			c.HeartbeatMs = -1 // the consumer is silent on purpose
			c.OutboundBytesMax = capBytes
			c.SlowConsumerTimeoutMs = timeoutMs
			c.WriteTimeoutMs = 60_000
		})
		body := bytes.Repeat([]byte{'b'}, bodyBytes)
		publish := func(n int) {
			for range n {
				fake.Publish(&protocol.Publish{Topic: "t", Body: body}, func(protocol.PublishOK, error) {})
			}
		}
		publish(msgs)
		c := p.dial()
		c.hello(protocol.Hello{})
		c.subscribe(protocol.Subscribe{Topic: "t", Partition: -1, AckMode: protocol.AckManual, Prefetch: 1000})
		synctest.Wait() // everyone is blocked: the writer on the pipe, deliveries paused

		ready, inflight, _, _ := fake.Counts("t", "")
		// The cap, plus the frame that crossed it, plus what the client's
		// bufio already pulled out of the pipe (4 KiB).
		if most := (capBytes+4096)/frameBytes + 1; inflight > most || ready == 0 {
			t.Fatalf("delivered %d of %d while the consumer did not read; want at most %d (cap %d B)", inflight, msgs, most, capBytes)
		}
		if st := p.srv.Stats(); st.WriterPauses == 0 {
			t.Fatalf("stats %+v: want a writer pause", st)
		}

		// Reading again drains the writer, which wakes the subscription.
		for i := range msgs {
			_, d := expect[*protocol.Deliver](c)
			if d.Tag != uint64(i+1) {
				t.Fatalf("delivery %d has tag %d", i, d.Tag)
			}
		}
		synctest.Wait()
		if ready, inflight, _, _ := fake.Counts("t", ""); ready != 0 || inflight != msgs {
			t.Fatalf("after reading: ready %d inflight %d, want 0 and %d", ready, inflight, msgs)
		}

		// Now it stops reading for good: paused at the cap, then closed.
		publish(msgs)
		synctest.Wait()
		time.Sleep(timeoutMs*time.Millisecond + 100*time.Millisecond) // fake time: past the slow-consumer timeout
		c.expectFatal(protocol.CodeSlowConsumer)
		synctest.Wait()
		if st := p.srv.Stats(); st.SlowConsumers != 1 || st.ConnectionsOpen != 0 {
			t.Fatalf("stats %+v: want one slow consumer, no connection open", st)
		}
		// No grace: the session was cleaned up and every lease is ready again.
		if ready, inflight, _, _ := fake.Counts("t", ""); ready != 2*msgs || inflight != 0 {
			t.Fatalf("after the disconnect: ready %d inflight %d, want %d and 0", ready, inflight, 2*msgs)
		}
		p.shutdown()
	})
}

// TestOutboundCapDrainingConsumerStays: a consumer that reaches the cap but
// reads it down within the timeout is paused and resumed, never closed.
func TestOutboundCapDrainingConsumerStays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := sessiontest.New()
		p := newPipeServer(t, func(c *Config) {
			c.Backend = fake
			c.HeartbeatMs = -1
			c.OutboundBytesMax = 4 << 10
			c.SlowConsumerTimeoutMs = 5000
		})
		body := bytes.Repeat([]byte{'b'}, 1<<10)
		for range 50 {
			fake.Publish(&protocol.Publish{Topic: "t", Body: body}, func(protocol.PublishOK, error) {})
		}
		c := p.dial()
		c.hello(protocol.Hello{})
		c.subscribe(protocol.Subscribe{Topic: "t", Partition: -1, AckMode: protocol.AckManual, Prefetch: 1000})
		for range 50 {
			synctest.Wait()
			time.Sleep(500 * time.Millisecond) // fake time: slow, but under the timeout per half-cap
			expect[*protocol.Deliver](c)
		}
		c.ping()
		if st := p.srv.Stats(); st.SlowConsumers != 0 || st.WriterPauses == 0 {
			t.Fatalf("stats %+v: want pauses and no slow consumer", st)
		}
		p.shutdown()
	})
}

// TestWriteTimeoutShorterThanSlowConsumerTimeout: reaching the cap never gives
// a blocked write more time than the write timeout it already had.
func TestWriteTimeoutShorterThanSlowConsumerTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := sessiontest.New()
		p := newPipeServer(t, func(c *Config) {
			c.Backend = fake
			c.HeartbeatMs = -1
			c.OutboundBytesMax = 4 << 10
			c.SlowConsumerTimeoutMs = 60_000
			c.WriteTimeoutMs = 1000
		})
		c := p.dial()
		c.hello(protocol.Hello{})
		c.subscribe(protocol.Subscribe{Topic: "t", Partition: -1, AckMode: protocol.AckManual, Prefetch: 1000})
		body := bytes.Repeat([]byte{'b'}, 1<<10)
		publish := func(n int) {
			for range n {
				fake.Publish(&protocol.Publish{Topic: "t", Body: body}, func(protocol.PublishOK, error) {})
			}
		}
		publish(2)
		synctest.Wait() // the writer is blocked writing them, deadline 1 s out
		publish(18)     // the queue reaches the cap during that write
		synctest.Wait()
		start := time.Now()
		// Fake time: past the 1 s write timeout and the 1 s bound on the
		// ERROR slow_consumer it then tries to send, far short of 60 s.
		time.Sleep(2100 * time.Millisecond)
		synctest.Wait()
		// Closed by the write timeout, not 60 s later; the writer was full,
		// so the reason is still slow_consumer.
		if st := p.srv.Stats(); st.ConnectionsOpen != 0 || st.SlowConsumers != 1 {
			t.Fatalf("after %v: stats %+v, want the connection closed by its write timeout as a slow consumer", time.Since(start), st)
		}
		p.shutdown()
	})
}

// TestSlowlorisHandshakeCut: a HELLO trickled one byte at a time does not
// extend the handshake timeout: the connection is cut with handshake_timeout
// before the trickle could finish.
func TestSlowlorisHandshakeCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPipeServer(t, nil) // handshake timeout 2 s
		c := p.dial()
		hello := protocol.AppendFrame(nil, 0, 1, &protocol.Hello{ProtocolVersion: protocol.Version, ClientName: "slowloris"})
		sent := make(chan int, 1)
		go func() {
			n := 0
			for _, b := range hello {
				if _, err := c.nc.Write([]byte{b}); err != nil {
					break
				}
				n++
				time.Sleep(300 * time.Millisecond) // fake time: one byte every 300 ms
			}
			sent <- n
		}()
		c.expectFatal(protocol.CodeHandshakeTimeout)
		c.nc.Close()
		if n := <-sent; n >= len(hello) {
			t.Fatalf("the whole %d-byte HELLO went through before the cut", len(hello))
		}
		p.shutdown()
	})
}
