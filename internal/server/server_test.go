package server

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"

	"go.uber.org/goleak"

	"github.com/sinewmq/sinew/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHandshake(t *testing.T) {
	fx := start(t, func(c *Config) { c.ReconnectGraceMs = 1500; c.HeartbeatMs = 4000 })
	c := fx.dial()
	ok := c.hello(protocol.Hello{ClientName: "t"})
	if ok.Outcome != protocol.ResumeNew || ok.Resume.OwnerID != "owner-test" || ok.Resume.ClientID == "" ||
		len(ok.Resume.Token) != 32 || ok.ServerGeneration != fx.srv.Generation() || ok.ServerGeneration == 0 {
		t.Fatalf("HELLO_OK %+v", ok)
	}
	if ok.HeartbeatMs != 4000 || ok.ReconnectGraceMs != 1500 || ok.Limits.FrameBytesMax != FrameBytesMaxDefault ||
		ok.Limits.PublishInflightMax != PublishInflightMaxDefault {
		t.Fatalf("HELLO_OK announces %+v", ok)
	}
	c.ping()
	// HELLO twice is fatal.
	c.send(0, &protocol.Hello{ProtocolVersion: protocol.Version})
	c.expectFatal(protocol.CodeHandshakeRequired)
}

func TestPublishSubscribeSettle(t *testing.T) {
	fx := start(t, nil)
	c := fx.dial()
	c.hello(protocol.Hello{})
	c.send(0, &protocol.DeclareQueue{Topic: "jobs"})
	if _, d := expect[*protocol.DeclareOK](c); !d.Created || d.Partitions != 1 {
		t.Fatalf("DECLARE_OK %+v", d)
	}
	for i, body := range []string{"a", "b", "c"} {
		if ok := c.publish("jobs", body); ok.Offset != uint64(i) {
			t.Fatalf("offset %d, want %d", ok.Offset, i)
		}
	}
	sub := c.subscribe(protocol.Subscribe{Topic: "jobs", Partition: -1, Prefetch: 2})
	if sub.Prefetch != 2 || len(sub.Partitions) != 1 {
		t.Fatalf("SUBSCRIBE_OK %+v", sub)
	}
	_, d1 := expect[*protocol.Deliver](c)
	_, d2 := expect[*protocol.Deliver](c)
	if string(d1.Body) != "a" || string(d2.Body) != "b" || d1.SubID != sub.SubID || d2.Tag <= d1.Tag {
		t.Fatalf("deliveries %+v %+v", d1, d2)
	}
	// Prefetch 2: the third message waits for a settle. A PING round trip shows
	// nothing else was queued.
	c.ping()
	codes, got := c.settleAnd(1, protocol.OpAck, d1.Tag)
	if codes[0] != protocol.CodeOK {
		t.Fatalf("ack: %v", codes)
	}
	d3 := got[protocol.OpDeliver][0].(*protocol.Deliver)
	if string(d3.Body) != "c" {
		t.Fatalf("third delivery %q", d3.Body)
	}
	// NACK requeues: "b" comes back with attempt 2 and a new tag.
	codes, got = c.settleAnd(1, protocol.OpNack, d2.Tag)
	if codes[0] != protocol.CodeOK {
		t.Fatalf("nack: %v", codes)
	}
	again := got[protocol.OpDeliver][0].(*protocol.Deliver)
	if string(again.Body) != "b" || again.Attempt != 2 || again.Tag <= d3.Tag {
		t.Fatalf("redelivery %+v", again)
	}
	codes = c.settle(protocol.OpFail, again.Tag, d3.Tag, 12345, d1.Tag)
	want := []protocol.Code{protocol.CodeOK, protocol.CodeOK, protocol.CodeUnknownTag, protocol.CodeStaleLease}
	for i := range want {
		if codes[i] != want[i] {
			t.Fatalf("codes %v, want %v", codes, want)
		}
	}
	if r, in, acked, failed := fx.fake.Counts("jobs", ""); r != 0 || in != 0 || acked != 1 || failed != 2 {
		t.Fatalf("queue ready=%d inflight=%d acked=%d failed=%d", r, in, acked, failed)
	}
	// Unsubscribe answers OK; an unknown sub id is not_found but not fatal.
	c.send(0, &protocol.Unsubscribe{SubID: sub.SubID})
	expect[*protocol.OK](c)
	c.send(0, &protocol.Unsubscribe{SubID: sub.SubID})
	if _, e := expect[*protocol.ErrorBody](c); e.Code != protocol.CodeNotFound || e.Fatal {
		t.Fatalf("error %+v", e)
	}
	c.ping()
}

func TestNoReplyAndAutoAck(t *testing.T) {
	fx := start(t, nil)
	c := fx.dial()
	c.hello(protocol.Hello{})
	for range 5 {
		c.send(protocol.FlagNoReply, &protocol.Publish{Topic: "q", Body: []byte("x")})
	}
	c.send(protocol.FlagNoReply, &protocol.Publish{Topic: "", Body: []byte("x")}) // errors are still reported
	if _, e := expect[*protocol.ErrorBody](c); e.Code != protocol.CodeBadRequest || e.Fatal {
		t.Fatalf("error %+v", e)
	}
	c.subscribe(protocol.Subscribe{Topic: "q", AckMode: protocol.AckAuto, Prefetch: 2})
	for range 5 {
		expect[*protocol.Deliver](c)
	}
	c.ping() // every DELIVER was written before the PONG, so every auto-ack ran
	if r, in, acked, _ := fx.fake.Counts("q", ""); r != 0 || in != 0 || acked != 5 {
		t.Fatalf("ready=%d inflight=%d acked=%d", r, in, acked)
	}
	// A NoReply settle with a bad tag still reports an error.
	c.send(protocol.FlagNoReply, &protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{999}})
	if _, e := expect[*protocol.ErrorBody](c); e.Code != protocol.CodeUnknownTag {
		t.Fatalf("error %+v", e)
	}
}

func TestRequestErrorsAreNotFatal(t *testing.T) {
	fx := start(t, func(c *Config) { c.BodyBytesMax = 100; c.SettleBatchMax = 2; c.FrameBytesMax = protocol.FrameBytesMin })
	c := fx.dial()
	c.hello(protocol.Hello{})
	cases := []struct {
		name string
		body protocol.Body
		code protocol.Code
	}{
		{"big body", &protocol.Publish{Topic: "q", Body: make([]byte, 101)}, protocol.CodeMessageTooLarge},
		{"settle batch", &protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{1, 2, 3}}, protocol.CodeLimitExceeded},
		{"empty settle", &protocol.Settle{Kind: protocol.OpAck}, protocol.CodeBadRequest},
		{"server op", &protocol.HelloOK{}, protocol.CodeUnknownOp},
		{"bad subscribe", &protocol.Subscribe{Topic: ""}, protocol.CodeBadRequest},
		{"bad declare", &protocol.DeclareQueue{Topic: ""}, protocol.CodeBadRequest},
		{"bad reconcile", &protocol.Reconcile{Policy: 9}, protocol.CodeBadRequest},
	}
	for _, tc := range cases {
		id := c.send(0, tc.body)
		h, e := expect[*protocol.ErrorBody](c)
		if e.Code != tc.code || e.Fatal || h.RequestID != id {
			t.Fatalf("%s: error %+v (request %d), want %v for request %d", tc.name, e, h.RequestID, tc.code, id)
		}
	}
	// An op code no version defines.
	c.raw(rawFrame(protocol.Version, 0x7e, 77, nil))
	if h, e := expect[*protocol.ErrorBody](c); e.Code != protocol.CodeUnknownOp || e.Fatal || h.RequestID != 77 {
		t.Fatalf("unknown op: %+v", e)
	}
	c.ping()
}

// rawFrame builds a frame by hand, for ops and versions the codec would not produce.
func rawFrame(version uint8, op uint8, reqID uint64, body []byte) []byte {
	b := make([]byte, protocol.LengthBytes+protocol.HeaderBytes, protocol.LengthBytes+protocol.HeaderBytes+len(body))
	binary.BigEndian.PutUint32(b, uint32(protocol.HeaderBytes+len(body)))
	b[4], b[5] = version, op
	binary.BigEndian.PutUint64(b[8:], reqID)
	return append(b, body...)
}

// TestBadInputIsFatalAndIsolated sends each kind of hostile input on its own
// connection and checks the typed fatal ERROR, the close, and that a bystander
// connected all along keeps working.
func TestBadInputIsFatalAndIsolated(t *testing.T) {
	fx := start(t, func(c *Config) { c.AuthTokens, c.AuthFailureDelayMs = []string{"secret", "other"}, -1 })
	bystander := fx.dial()
	bystander.hello(protocol.Hello{Credentials: "other"})
	bystander.publish("q", "before")

	hello := protocol.AppendFrame(nil, 0, 1, &protocol.Hello{ProtocolVersion: protocol.Version, Credentials: "secret"})
	big := make([]byte, 4)
	binary.BigEndian.PutUint32(big, FrameBytesMaxDefault) // plus the length prefix: one byte over
	// Before HELLO_OK the limit is the protocol's 1 MiB, below the
	// negotiated FrameBytesMaxDefault: one byte over it is refused at once.
	bigBeforeHello := make([]byte, 4)
	binary.BigEndian.PutUint32(bigBeforeHello, protocol.FrameBytesDefault-protocol.LengthBytes+1)
	cases := []struct {
		name   string
		input  []byte
		code   protocol.Code
		helloF bool // send a good HELLO first
	}{
		{"garbage", []byte("\x00\x00\x00\x02garbage \xff\xfe bytes"), protocol.CodeBadFrame, false},
		{"text protocol", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), protocol.CodeFrameTooLarge, false},
		{"garbage after hello", []byte("\x00\x00\x00\x0b\x01garbage\xff\xfe"), protocol.CodeBadFrame, true},
		{"short length", []byte{0, 0, 0, 3, 1, 2, 3}, protocol.CodeBadFrame, false},
		{"oversized", big, protocol.CodeFrameTooLarge, false},
		{"oversized after hello", big, protocol.CodeFrameTooLarge, true},
		{"over 1 MiB before hello", bigBeforeHello, protocol.CodeFrameTooLarge, false},
		{"not hello first", protocol.AppendFrame(nil, 0, 1, &protocol.Ping{}), protocol.CodeHandshakeRequired, false},
		{"bad version", rawFrame(9, uint8(protocol.OpHello), 1, nil), protocol.CodeUnsupportedVer, false},
		{"bad hello body", rawFrame(protocol.Version, uint8(protocol.OpHello), 1, []byte{0xff}), protocol.CodeBadFrame, false},
		{"hello version", protocol.AppendFrame(nil, 0, 1, &protocol.Hello{ProtocolVersion: 2, Credentials: "secret"}), protocol.CodeUnsupportedVer, false},
		{"wrong token", protocol.AppendFrame(nil, 0, 1, &protocol.Hello{ProtocolVersion: 1, Credentials: "nope"}), protocol.CodeAuthFailed, false},
		{"no token", protocol.AppendFrame(nil, 0, 1, &protocol.Hello{ProtocolVersion: 1}), protocol.CodeAuthFailed, false},
		{"bad publish body", rawFrame(protocol.Version, uint8(protocol.OpPublish), 2, []byte{0x05, 'a'}), protocol.CodeBadFrame, true},
		{"truncated frame", []byte{0, 0, 0, 40, 1, 0x12, 0, 0}, protocol.CodeBadFrame, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := fx.dial()
			c.t = t
			if tc.helloF {
				c.raw(hello)
				expect[*protocol.HelloOK](c)
			}
			c.raw(tc.input)
			if tc.name == "truncated frame" {
				c.nc.(*net.TCPConn).CloseWrite() // the peer goes away mid-frame
			}
			c.expectFatal(tc.code)
			bystander.t = t
			bystander.ping()
		})
	}
	bystander.t = t
	bystander.publish("q", "after")
	if st := fx.srv.Stats(); st.FatalErrors != uint64(len(cases)) || st.AuthFailures != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestTooManyConnections(t *testing.T) {
	fx := start(t, func(c *Config) { c.ConnectionsMax = 1 })
	first := fx.dial()
	first.hello(protocol.Hello{})
	second := fx.dial()
	second.expectFatal(protocol.CodeTooManyConns)
	first.ping()
	if st := fx.srv.Stats(); st.ConnectionsRejected != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestResumeOverTCP(t *testing.T) {
	fx := start(t, func(c *Config) { c.ReconnectGraceMs = 60_000 })
	c1 := fx.dial()
	ok1 := c1.hello(protocol.Hello{})
	c1.publish("q", "m1")
	c1.publish("q", "m2")
	c1.subscribe(protocol.Subscribe{Topic: "q", Prefetch: 10})
	_, d1 := expect[*protocol.Deliver](c1)
	_, d2 := expect[*protocol.Deliver](c1)
	c1.nc.Close()

	c2 := fx.dial()
	ok2 := c2.hello(protocol.Hello{Resume: ok1.Resume})
	if ok2.Outcome != protocol.ResumeResumed || ok2.Resume.ClientID != ok1.Resume.ClientID {
		t.Fatalf("resume: %+v", ok2)
	}
	// The client did not reconcile: before the answer to its first request it
	// gets again, unchanged, the deliveries the first socket may have lost.
	id := c2.send(0, &protocol.Ping{})
	for _, want := range []*protocol.Deliver{d1, d2} {
		if _, d := expect[*protocol.Deliver](c2); d.Tag != want.Tag || d.Attempt != want.Attempt || string(d.Body) != string(want.Body) {
			t.Fatalf("re-sent %+v, want %+v", d, want)
		}
	}
	if h, _ := expect[*protocol.Pong](c2); h.RequestID != id {
		t.Fatalf("pong for %d, want %d", h.RequestID, id)
	}
	c2.ping() // once per resume
	// Tags from the first socket settle on the second.
	if codes := c2.settle(protocol.OpAck, d1.Tag, d2.Tag); codes[0] != protocol.CodeOK || codes[1] != protocol.CodeOK {
		t.Fatalf("late settle: %v", codes)
	}
	// The subscription carried over: a new message is delivered here.
	c2.send(0, &protocol.Publish{Topic: "q", Body: []byte("m3")})
	got := c2.readN(2)
	if len(got[protocol.OpPublishOK]) != 1 || len(got[protocol.OpDeliver]) != 1 {
		t.Fatalf("frames %v", got)
	}
	if d3 := got[protocol.OpDeliver][0].(*protocol.Deliver); string(d3.Body) != "m3" || d3.Tag <= d2.Tag {
		t.Fatalf("delivery after resume %+v", d3)
	}
	// A wrong token is refused with a fresh identity.
	c3 := fx.dial()
	bad := ok1.Resume
	bad.Token = []byte("wrong")
	if ok3 := c3.hello(protocol.Hello{Resume: bad}); ok3.Outcome != protocol.ResumeRejected || ok3.Resume.ClientID == bad.ClientID {
		t.Fatalf("bad resume: %+v", ok3)
	}
}

func TestShutdownDrains(t *testing.T) {
	fake := start(t, nil) // cleanup's Shutdown is a no-op after ours
	fx := fake
	c := fx.dial()
	c.hello(protocol.Hello{})
	fx.fake.HoldConfirms(true)
	pubID := c.send(0, &protocol.Publish{Topic: "q", Body: []byte("inflight")})
	c.ping() // the publish reached the backend

	done := make(chan error, 1)
	go func() { done <- fx.srv.Shutdown(context.Background()) }()
	_, away := expect[*protocol.GoingAway](c)
	if away.Reason == "" || away.DeadlineMs == 0 {
		t.Fatalf("GOING_AWAY %+v", away)
	}
	c.send(0, &protocol.Publish{Topic: "q", Body: []byte("late")})
	if _, e := expect[*protocol.ErrorBody](c); e.Code != protocol.CodeShuttingDown || e.Fatal {
		t.Fatalf("publish while draining: %+v", e)
	}
	fx.fake.ReleaseConfirms()
	h, _ := expect[*protocol.PublishOK](c)
	if h.RequestID != pubID {
		t.Fatalf("confirm for %d, want %d", h.RequestID, pubID)
	}
	c.expectClosed()
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if fx.srv.Stats().Sessions.Sessions != 0 {
		t.Fatalf("sessions left: %+v", fx.srv.Stats().Sessions)
	}
}

func TestBackpressureHeldConfirms(t *testing.T) {
	const inflightMax = 8
	const total = 1000
	paused := make(chan struct{}, 1)
	pubs := make(chan struct{}, total)
	fx := start(t, func(c *Config) { c.PublishInflightMax = inflightMax })
	fx.fake.OnPublish = func(int) { pubs <- struct{}{} }
	fx.srv.testHookReaderPaused = func() {
		select {
		case paused <- struct{}{}:
		default:
		}
	}
	fx.fake.HoldConfirms(true)
	c := fx.dial()
	c.hello(protocol.Hello{})
	frames := make([]byte, 0, 64<<10)
	for range total {
		frames = protocol.AppendFrame(frames, 0, 1, &protocol.Publish{Topic: "q", Body: []byte("payload")})
	}
	c.raw(frames) // fits in socket buffers; the server must stop reading anyway
	<-paused
	if n := fx.fake.Published(); n != inflightMax {
		t.Fatalf("backend saw %d publishes while %d were unconfirmed, want exactly %d", n, inflightMax, inflightMax)
	}
	if st := fx.srv.Stats(); st.PublishesInflight != inflightMax {
		t.Fatalf("inflight %d", st.PublishesInflight)
	}
	// Releasing confirms lets the reader go on, one window at a time: the backend
	// never sees more than inflightMax publishes beyond what was confirmed.
	seen, confirmed := 0, 0
	for confirmed < total {
		for want := min(confirmed+inflightMax, total); seen < want; seen++ {
			<-pubs
		}
		if n := fx.fake.Published(); n != seen {
			t.Fatalf("backend saw %d publishes with %d confirmed, want %d", n, confirmed, seen)
		}
		n := fx.fake.ReleaseConfirms()
		for range n {
			expect[*protocol.PublishOK](c)
		}
		confirmed += n
	}
	c.ping()
}

// smallBuffers shrinks socket buffers on accepted connections so that a peer that
// never reads fills them quickly.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4096)
		tc.SetReadBuffer(4096)
	}
	return nc, err
}

// TestBackpressureNonReadingPeer: a client that publishes without ever reading its
// confirms. The server's memory must stay bounded: once the socket is full, confirms
// wait in the write queue up to PublishInflightMax and then the reader stops.
func TestBackpressureNonReadingPeer(t *testing.T) {
	const inflightMax = 64
	fake := start(t, func(c *Config) { c.PublishInflightMax = inflightMax })
	srv := fake.srv
	paused := make(chan struct{}, 1)
	srv.testHookReaderPaused = func() {
		if srv.Stats().PublishesInflight >= inflightMax {
			select {
			case paused <- struct{}{}:
			default:
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(smallBuffers{ln})
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	nc.(*net.TCPConn).SetReadBuffer(4096)
	c := wrap(t, nc)
	c.hello(protocol.Hello{})
	const total = 200_000
	writeDone := make(chan struct{})
	go func() {
		defer close(writeDone)
		frame := protocol.AppendFrame(nil, 0, 1, &protocol.Publish{Topic: "q", Body: []byte("payload")})
		batch := make([]byte, 0, 1000*len(frame))
		for range 1000 {
			batch = append(batch, frame...)
		}
		for range total / 1000 {
			if _, err := nc.Write(batch); err != nil {
				return // the test closed the socket once the server stopped reading
			}
		}
	}()
	<-paused
	published := fake.fake.Published()
	if published >= total {
		t.Fatalf("server read all %d publishes from a peer that reads nothing", total)
	}
	if q := srv.Stats().PublishesInflight; q > inflightMax {
		t.Fatalf("%d confirms pending, limit %d", q, inflightMax)
	}
	t.Logf("server accepted %d of %d publishes before pausing", published, total)
	nc.Close()
	<-writeDone
}

// TestShutdownSettlesBeforeClosing: a drain leases nothing new, takes the ack
// of what a consumer already holds, and closes the connection only once that
// settle is answered. Shutdown returns nil, so it ended because nothing was in
// flight, not because its (distant) deadline passed.
func TestShutdownSettlesBeforeClosing(t *testing.T) {
	fx := start(t, nil)
	c := fx.dial()
	c.hello(protocol.Hello{})
	c.publish("q", "m1")
	c.publish("q", "m2")
	c.subscribe(protocol.Subscribe{Topic: "q", Prefetch: 1})
	_, d1 := expect[*protocol.Deliver](c)
	if string(d1.Body) != "m1" {
		t.Fatalf("first delivery %q", d1.Body)
	}

	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fx.srv.Shutdown(ctx) }()
	_, away := expect[*protocol.GoingAway](c)
	if away.Redirect != "" || away.DeadlineMs == 0 {
		t.Fatalf("GOING_AWAY %+v", away)
	}
	select {
	case err := <-done:
		t.Fatalf("shutdown returned %v while a delivery was unsettled", err)
	default:
	}
	// The ack frees prefetch credit; without the drain it would bring m2.
	if codes := c.settle(protocol.OpAck, d1.Tag); len(codes) != 1 || codes[0] != protocol.CodeOK {
		t.Fatalf("ack while draining: %v", codes)
	}
	c.expectClosed()
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if ready, inflight, acked, _ := fx.fake.Counts("q", ""); ready != 1 || inflight != 0 || acked != 1 {
		t.Fatalf("after drain: ready %d inflight %d acked %d, want 1 0 1", ready, inflight, acked)
	}
}

// TestShutdownDeadlineWithUnsettled: a consumer that never settles holds the
// drain only until its deadline; then its connection is closed and Shutdown
// says it ran out of time.
func TestShutdownDeadlineWithUnsettled(t *testing.T) {
	fx := start(t, nil)
	c := fx.dial()
	c.hello(protocol.Hello{})
	c.publish("q", "m1")
	c.subscribe(protocol.Subscribe{Topic: "q", Prefetch: 1})
	expect[*protocol.Deliver](c)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fx.srv.Shutdown(ctx) }()
	expect[*protocol.GoingAway](c)
	c.ping() // the connection still serves while phase 1 waits
	cancel()
	c.expectClosed()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("shutdown: %v, want context.Canceled", err)
	}
}

// TestShutdownEndsWhenTheClientLeaves: a client that leaves during the drain
// (as the SDK does once its own work is done) takes its session's deliveries
// with it, so the drain ends then, not at its deadline.
func TestShutdownEndsWhenTheClientLeaves(t *testing.T) {
	fx := start(t, nil)
	c := fx.dial()
	c.hello(protocol.Hello{})
	c.publish("q", "m1")
	c.subscribe(protocol.Subscribe{Topic: "q", Prefetch: 1})
	expect[*protocol.Deliver](c)

	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fx.srv.Shutdown(ctx) }()
	expect[*protocol.GoingAway](c)
	c.nc.Close()
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v, want nil (the drain ended when the client left)", err)
	}
}
