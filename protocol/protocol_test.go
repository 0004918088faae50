package protocol

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"
)

func sampleBodies() []Body {
	sv := SubView{SubID: 7, Topic: "orders", Group: "g", Partition: -1, AckMode: AckAuto, Prefetch: 32}
	return []Body{
		&Hello{ProtocolVersion: 1, ClientName: "cli", ClientVersion: "0.1", Credentials: "tok",
			Resume: ResumeIdentity{ClientID: "c-1", OwnerID: "o-1", Token: []byte{1, 2, 3}}},
		&HelloOK{ProtocolVersion: 1, ServerVersion: "0.1.0", Resume: ResumeIdentity{ClientID: "c", OwnerID: "o", Token: []byte("t")},
			Outcome: ResumeResumed, ServerGeneration: 99, HeartbeatMs: 5000, ReconnectGraceMs: 5000,
			Limits: Limits{1 << 20, 1 << 19, 1000, 512, 4096, 64}},
		&Ping{}, &Pong{}, &OK{},
		&ErrorBody{Code: CodeStaleLease, Message: "lease 4 is not current", Fatal: true},
		&DeclareQueue{Topic: "t", Group: "g", Partitions: 4, DeadLetterMode: DeadLetterQueue, DeadLetterTarget: "dlq",
			MaxRetries: -1, DefaultTTLMs: 1000, LeaseMs: 30000},
		&DeclareOK{Partitions: 4, Created: true},
		&Publish{Topic: "t", Group: "g", Partition: -1, Key: []byte("k"), Headers: []Header{{"a", "b"}, {"c", ""}},
			ContentType: "text/plain", DelayMs: 10, NotBeforeMs: -5, TTLMs: 100, ProducerID: "p", ProducerSeq: 1 << 40,
			Body: []byte("hello")},
		&PublishOK{Partition: 3, Offset: 1 << 50, Duplicate: true},
		&DeleteQueue{Topic: "t", Group: "g"},
		&PurgeQueue{Topic: "t", Group: ""},
		&PurgeOK{Purged: 1 << 33},
		&Subscribe{Topic: "t", Group: "g", Partition: 2, AckMode: AckManual, Prefetch: 64},
		&SubscribeOK{SubID: 5, Partitions: []uint32{0, 1, 2}, Prefetch: 64},
		&Unsubscribe{SubID: 5},
		&SubClosed{SubID: 5, Reason: SubClosedError, Code: CodeUnavailable, Message: "quarantined"},
		&Deliver{SubID: 5, Tag: 9, Partition: 1, Offset: 77, Attempt: 2, PublishedAtMs: 1700000000000, Key: []byte("k"),
			Headers: []Header{{"x", "y"}}, ContentType: "application/json", Body: []byte(`{}`), Topic: "t", Group: "g", LeaseID: 1 << 40, Epoch: 3},
		&Settle{Kind: OpAck, Tags: []uint64{1, 2, 3}},
		&Settle{Kind: OpAck, Tags: []uint64{1, 2}, Leases: []LeaseRef{{SubID: 5, Partition: 1, Offset: 77, LeaseID: 1 << 40}, {SubID: 5, Offset: 78, LeaseID: 9, Epoch: 1}}},
		&Settle{Kind: OpNack, Tags: []uint64{4}, DelayMs: 1500},
		&Settle{Kind: OpFail, Tags: []uint64{5, 6}},
		&SettleResult{Codes: []Code{CodeOK, CodeStaleLease}},
		&Extend{Tags: []uint64{1, 2}, ExtendMs: 30000, Leases: []LeaseRef{{SubID: 5, Partition: 1, Offset: 77, LeaseID: 1 << 40}, {SubID: 5, Offset: 78, LeaseID: 9, Epoch: 1}}},
		&Extend{Tags: []uint64{7}, ExtendMs: -1},
		&GoingAway{DeadlineMs: 123, GraceMs: 5000, Reason: "restart", Redirect: "127.0.0.1:7000"},
		&Reconcile{Policy: ReconcileRestore, Subs: []SubView{sv}},
		&Reconcile{Policy: ReconcileConservative, Subs: []SubView{sv}, InflightFollows: true},
		&EndSession{},
		&Inflight{Entries: []InflightEntry{{Tag: 9, Lease: LeaseRef{SubID: 5, Partition: 1, Offset: 77, LeaseID: 4}}, {Tag: 10}}},
		&InflightResult{Stale: []uint64{3, 4}, Resent: 2, Kept: 7},
		&ReconcileResult{Entries: []ReconcileEntry{{Action: ActionKeep, ClientSubID: 7, ServerSubID: 8, Client: sv, Server: sv, Reason: "matched"}}},
	}
}

func TestRoundTripEveryBody(t *testing.T) {
	var wire []byte
	bodies := sampleBodies()
	for i, b := range bodies {
		wire = AppendFrame(wire, uint16(i), uint64(1000+i), b)
	}
	r := bufio.NewReader(bytes.NewReader(wire))
	var buf []byte
	for i, want := range bodies {
		f, nb, err := ReadFrame(r, FrameBytesDefault, buf)
		buf = nb
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if f.Op != want.Op() || f.RequestID != uint64(1000+i) || f.Flags != uint16(i) || f.Version != Version {
			t.Fatalf("frame %d: header %+v", i, f.FrameHeader)
		}
		got, err := Decode(f)
		if err != nil {
			t.Fatalf("frame %d (%s): %v", i, want.Op(), err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("frame %d (%s):\n got %#v\nwant %#v", i, want.Op(), got, want)
		}
	}
	if _, _, err := ReadFrame(r, FrameBytesDefault, buf); err != io.EOF {
		t.Fatalf("after last frame: %v, want io.EOF", err)
	}
}

func TestOversizedFrameRejectedBeforeAllocation(t *testing.T) {
	wire := []byte{0x7f, 0xff, 0xff, 0xff}
	_, _, err := ReadFrame(bytes.NewReader(wire), FrameBytesDefault, nil)
	if CodeOf(err) != CodeFrameTooLarge {
		t.Fatalf("got %v, want frame_too_large", err)
	}
}

// TestAnnouncedFrameNotAllocatedUpFront: a peer that announces a frame just
// under the limit and then sends a few bytes costs a buffer the size of what
// it sent (rounded up to the first growth step), not the size it announced.
func TestAnnouncedFrameNotAllocatedUpFront(t *testing.T) {
	announced := FrameBytesDefault - LengthBytes
	wire := binary.BigEndian.AppendUint32(nil, uint32(announced))
	wire = append(wire, Version, 0, byte(OpPublish), 0, 0, 0, 0, 0, 0, 0, 0, 1) // header (fields are not checked before the body)
	wire = append(wire, make([]byte, 1000)...)                                  // 1000 body bytes, then the peer goes silent
	_, buf, err := ReadFrame(bytes.NewReader(wire), FrameBytesDefault, nil)
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("got %v, want io.ErrUnexpectedEOF", err)
	}
	if cap(buf) > frameGrowBytes {
		t.Fatalf("buffer of %d bytes for 1000 bytes received (announced %d); want at most %d", cap(buf), announced, frameGrowBytes)
	}
	// A whole large frame still reads, across the growth steps.
	body := bytes.Repeat([]byte{7}, 300<<10)
	f := AppendFrame(nil, 0, 9, &Publish{Topic: "t", Body: body})
	got, _, err := ReadFrame(bytes.NewReader(f), FrameBytesDefault, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(got)
	if err != nil || !bytes.Equal(m.(*Publish).Body, body) {
		t.Fatalf("large frame did not round-trip: %v", err)
	}
}

func TestMalformedBodies(t *testing.T) {
	cases := []struct {
		name string
		op   Op
		body []byte
		code Code
	}{
		{"unknown op", 0x7e, nil, CodeUnknownOp},
		{"truncated publish", OpPublish, []byte{5, 'a'}, CodeBadFrame},
		{"length beyond frame", OpUnsubscribe, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, CodeBadFrame},
		{"huge tag count", OpAck, []byte{0xff, 0xff, 0x03}, CodeBadFrame},
		{"bad utf8 topic", OpSubscribe, []byte{2, 0xff, 0xfe, 0, 0, 0, 0}, CodeBadFrame},
		{"bad bool", OpDeclareOK, []byte{1, 7}, CodeBadFrame},
		{"partition beyond 32 bits", OpSubscribe, []byte{1, 't', 0, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0}, CodeBadFrame},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(Frame{FrameHeader: FrameHeader{Version: Version, Op: c.op}, Body: c.body})
			if CodeOf(err) != c.code {
				t.Fatalf("got %v, want %s", err, c.code)
			}
		})
	}
}

func TestTrailingFieldsIgnored(t *testing.T) {
	// A newer peer may append fields; an older decoder must still read the body.
	body := (&Unsubscribe{SubID: 42}).AppendBody(nil)
	body = append(body, 1, 2, 3)
	got, err := Decode(Frame{FrameHeader: FrameHeader{Version: Version, Op: OpUnsubscribe}, Body: body})
	if err != nil || got.(*Unsubscribe).SubID != 42 {
		t.Fatalf("got %v %v", got, err)
	}
}

func TestWrongVersionReported(t *testing.T) {
	wire := AppendFrame(nil, 0, 1, &Ping{})
	wire[4] = 9
	_, _, err := ReadFrame(bytes.NewReader(wire), FrameBytesDefault, nil)
	if CodeOf(err) != CodeUnsupportedVer {
		t.Fatalf("got %v", err)
	}
}

func TestTruncatedStreamIsUnexpectedEOF(t *testing.T) {
	wire := AppendFrame(nil, 0, 1, &Publish{Topic: "t", Body: []byte("abc")})
	_, _, err := ReadFrame(bytes.NewReader(wire[:len(wire)-1]), FrameBytesDefault, nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v", err)
	}
}

func TestErrorTable(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range Codes() {
		n := c.String()
		if seen[n] {
			t.Fatalf("duplicate name %s", n)
		}
		seen[n] = true
	}
	if len(Codes()) != len(codeTable) {
		t.Fatalf("Codes() lists %d of %d", len(Codes()), len(codeTable))
	}
	err := error(Errorf(CodeStaleLease, "x"))
	if !errors.Is(err, &Error{Code: CodeStaleLease}) || errors.Is(err, &Error{Code: CodeNotFound}) {
		t.Fatal("errors.Is must match on code")
	}
}

func FuzzDecodeFrame(f *testing.F) {
	for _, b := range sampleBodies() {
		f.Add(AppendFrame(nil, 0, 1, b))
	}
	f.Add([]byte{0, 0, 0, 12, 1, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		var buf []byte
		for i := 0; i < 64; i++ {
			fr, nb, err := ReadFrame(r, FrameBytesMin, buf)
			buf = nb
			if err != nil {
				return
			}
			body, err := Decode(fr)
			if err != nil {
				if CodeOf(err) == CodeInternal {
					t.Fatalf("decoder error without a protocol code: %v", err)
				}
				continue
			}
			// Whatever decodes must re-encode and decode to the same value.
			again, err := Decode(Frame{FrameHeader: fr.FrameHeader, Body: body.AppendBody(nil)})
			if err != nil || !reflect.DeepEqual(normalize(again), normalize(body)) {
				t.Fatalf("re-encode mismatch for %s: %v\n%#v\n%#v", fr.Op, err, again, body)
			}
		}
	})
}

// normalize maps empty slices to nil so that re-encoded bodies compare equal.
func normalize(b Body) Body {
	switch m := b.(type) {
	case *Publish:
		c := *m
		if len(c.Key) == 0 {
			c.Key = nil
		}
		if len(c.Body) == 0 {
			c.Body = nil
		}
		return &c
	case *Deliver:
		c := *m
		if len(c.Key) == 0 {
			c.Key = nil
		}
		if len(c.Body) == 0 {
			c.Body = nil
		}
		return &c
	}
	return b
}

// TestAppendedFieldsOptional: bodies encoded before DELIVER's lease_id/epoch
// and the settles' leases were appended still decode, with the new fields zero.
func TestAppendedFieldsOptional(t *testing.T) {
	full := (&Deliver{SubID: 1, Tag: 2, Offset: 3, Topic: "t", Group: "g", LeaseID: 300, Epoch: 0, LeaseMs: 0}).AppendBody(nil)
	old := full[:len(full)-5] // lease_id 300 is two bytes, epoch 0, lease_ms 0 and assignment 0 one each
	got, err := Decode(Frame{FrameHeader: FrameHeader{Version: Version, Op: OpDeliver}, Body: old})
	if err != nil {
		t.Fatal(err)
	}
	if d := got.(*Deliver); d.LeaseID != 0 || d.Epoch != 0 || d.Group != "g" {
		t.Fatalf("old DELIVER decoded as %+v", d)
	}
	got, err = Decode(Frame{FrameHeader: FrameHeader{Version: Version, Op: OpDeliver}, Body: full[:len(full)-2]})
	if err != nil {
		t.Fatal(err)
	}
	if d := got.(*Deliver); d.LeaseID != 300 || d.LeaseMs != 0 {
		t.Fatalf("DELIVER without lease_ms decoded as %+v", d)
	}
	s := (&Settle{Kind: OpNack, Tags: []uint64{4}, DelayMs: 5}).AppendBody(nil)
	s = s[:len(s)-1] // drop the empty leases list
	got, err = Decode(Frame{FrameHeader: FrameHeader{Version: Version, Op: OpNack}, Body: s})
	if err != nil {
		t.Fatal(err)
	}
	if m := got.(*Settle); m.Leases != nil || m.DelayMs != 5 || len(m.Tags) != 1 {
		t.Fatalf("old NACK decoded as %+v", m)
	}
	// A leases list whose length differs from tags decodes; the server refuses it.
	s = (&Settle{Kind: OpAck, Tags: []uint64{1, 2}, Leases: []LeaseRef{{LeaseID: 1}}}).AppendBody(nil)
	if _, err := Decode(Frame{FrameHeader: FrameHeader{Version: Version, Op: OpAck}, Body: s}); err != nil {
		t.Fatal(err)
	}
	// A leases count beyond the frame is malformed, not an allocation.
	s = (&Settle{Kind: OpAck, Tags: []uint64{1}}).AppendBody(nil)
	s = append(s[:len(s)-1], 0xff, 0xff, 0x03)
	if _, err := Decode(Frame{FrameHeader: FrameHeader{Version: Version, Op: OpAck}, Body: s}); CodeOf(err) != CodeBadFrame {
		t.Fatalf("huge leases count: %v", err)
	}
}

// TestExtendCodec: EXTEND round-trips, keeps a leases list of any length for
// the server to judge, and, having been defined with its leases list, refuses
// a body that stops before it.
func TestExtendCodec(t *testing.T) {
	in := &Extend{Tags: []uint64{3, 1 << 60}, ExtendMs: 45_000, Leases: []LeaseRef{{SubID: 2, Partition: 7, Offset: 9, LeaseID: 11, Epoch: 4}, {LeaseID: 1}}}
	frame := AppendFrame(nil, FlagNoReply, 77, in)
	f, _, err := ReadFrame(bytes.NewReader(frame), FrameBytesDefault, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.Op != OpExtend || f.Op.String() != "EXTEND" || f.Flags != FlagNoReply || f.RequestID != 77 {
		t.Fatalf("header %+v", f.FrameHeader)
	}
	got, err := Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, in) {
		t.Fatalf("decoded %+v, want %+v", got, in)
	}
	// Mismatched lengths decode: the server answers bad_request per tag.
	s := (&Extend{Tags: []uint64{1, 2}, ExtendMs: 1, Leases: []LeaseRef{{LeaseID: 1}}}).AppendBody(nil)
	if _, err := Decode(Frame{FrameHeader: FrameHeader{Version: Version, Op: OpExtend}, Body: s}); err != nil {
		t.Fatal(err)
	}
	// Without the leases list, or without extend_ms, the body is malformed.
	s = (&Extend{Tags: []uint64{1}, ExtendMs: 5}).AppendBody(nil)
	for _, cut := range []int{1, 2} {
		if _, err := Decode(Frame{FrameHeader: FrameHeader{Version: Version, Op: OpExtend}, Body: s[:len(s)-cut]}); CodeOf(err) != CodeBadFrame {
			t.Fatalf("EXTEND cut by %d: %v, want bad_frame", cut, err)
		}
	}
	// A leases count beyond the frame is malformed, not an allocation.
	s = append(s[:len(s)-1], 0xff, 0xff, 0x03)
	if _, err := Decode(Frame{FrameHeader: FrameHeader{Version: Version, Op: OpExtend}, Body: s}); CodeOf(err) != CodeBadFrame {
		t.Fatalf("huge leases count: %v", err)
	}
}
