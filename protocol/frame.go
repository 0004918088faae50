package protocol

import (
	"encoding/binary"
	"errors"
	"io"
)

// Version is the protocol version this package speaks.
const Version = 1

const (
	// LengthBytes is the size of the length prefix.
	LengthBytes = 4
	// HeaderBytes is the size of the fixed header that follows the length prefix.
	HeaderBytes = 12
	// FrameBytesMin is the smallest frame limit a peer may announce.
	FrameBytesMin = 64 << 10
	// FrameBytesDefault is the frame limit until HELLO_OK announces another.
	FrameBytesDefault = 1 << 20
)

// Header flags.
const (
	// FlagNoReply asks the receiver not to answer a request (a publish without
	// confirm, a settle without result). Errors are still reported.
	FlagNoReply uint16 = 1 << 0
)

// FrameHeader is the fixed part of every frame.
type FrameHeader struct {
	Version   uint8
	Op        Op
	Flags     uint16
	RequestID uint64 // chosen by the requester, echoed in the reply; 0 on pushes
}

// Frame is one decoded frame. Body aliases the reader's buffer and is valid only
// until the next ReadFrame call on the same buffer.
type Frame struct {
	FrameHeader
	Body []byte
}

// ErrFrameTooLarge is returned (wrapped in *Error) when a length prefix exceeds the limit.
var ErrFrameTooLarge = &Error{Code: CodeFrameTooLarge}

// ReadFrame reads one frame from r. frameBytesMax bounds the length prefix; buf is
// reused for the body when large enough. A length above the limit is reported
// before anything is allocated. io.EOF is returned only on a clean frame boundary.
func ReadFrame(r io.Reader, frameBytesMax int, buf []byte) (Frame, []byte, error) {
	var lp [LengthBytes + HeaderBytes]byte
	if _, err := io.ReadFull(r, lp[:LengthBytes]); err != nil {
		return Frame{}, buf, err
	}
	n := binary.BigEndian.Uint32(lp[:LengthBytes])
	if n < HeaderBytes {
		return Frame{}, buf, Errorf(CodeBadFrame, "frame length %d shorter than header", n)
	}
	if uint64(n)+LengthBytes > uint64(frameBytesMax) {
		return Frame{}, buf, Errorf(CodeFrameTooLarge, "frame of %d bytes exceeds limit %d", uint64(n)+LengthBytes, frameBytesMax)
	}
	if _, err := io.ReadFull(r, lp[LengthBytes:]); err != nil {
		return Frame{}, buf, unexpected(err)
	}
	h := ParseHeader(lp[LengthBytes:])
	bodyLen := int(n) - HeaderBytes
	var body []byte
	if cap(buf) >= bodyLen || bodyLen <= frameGrowBytes {
		if cap(buf) < bodyLen {
			buf = make([]byte, bodyLen)
		}
		body = buf[:bodyLen]
		if _, err := io.ReadFull(r, body); err != nil {
			return Frame{}, buf, unexpected(err)
		}
	} else {
		// A large frame's buffer grows as its bytes arrive, so a peer that
		// announces a big frame and sends little of it costs what it sent,
		// not what it announced.
		body = buf[:0]
		for len(body) < bodyLen {
			next := min(bodyLen, max(2*len(body), frameGrowBytes))
			if cap(body) < next {
				body = append(make([]byte, 0, next), body...)
			}
			if _, err := io.ReadFull(r, body[len(body):next]); err != nil {
				return Frame{}, body, unexpected(err)
			}
			body = body[:next]
		}
		buf = body
	}
	if h.Version != Version {
		return Frame{FrameHeader: h}, buf, Errorf(CodeUnsupportedVer, "frame version %d, want %d", h.Version, Version)
	}
	return Frame{FrameHeader: h, Body: body}, buf, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// frameGrowBytes is the largest body ReadFrame allocates before any of it has
// arrived; larger bodies grow by doubling from here as they are read.
const frameGrowBytes = 64 << 10

// ParseHeader decodes the 12 header bytes that follow the length prefix.
func ParseHeader(b []byte) FrameHeader {
	return FrameHeader{
		Version:   b[0],
		Op:        Op(b[1]),
		Flags:     binary.BigEndian.Uint16(b[2:4]),
		RequestID: binary.BigEndian.Uint64(b[4:12]),
	}
}

// Body is implemented by every typed frame body.
type Body interface {
	// Op is the op code this body travels under.
	Op() Op
	// AppendBody appends the encoded body to dst.
	AppendBody(dst []byte) []byte
}

// AppendFrame appends a complete frame (length, header, body) to dst.
func AppendFrame(dst []byte, flags uint16, requestID uint64, body Body) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, LengthBytes+HeaderBytes)...)
	dst = body.AppendBody(dst)
	n := len(dst) - start - LengthBytes
	binary.BigEndian.PutUint32(dst[start:], uint32(n))
	dst[start+4] = Version
	dst[start+5] = byte(body.Op())
	binary.BigEndian.PutUint16(dst[start+6:], flags)
	binary.BigEndian.PutUint64(dst[start+8:], requestID)
	return dst
}

// Decode parses a frame body according to its op code.
func Decode(f Frame) (Body, error) {
	var b interface {
		Body
		decode(*dec)
	}
	switch f.Op {
	case OpHello:
		b = new(Hello)
	case OpHelloOK:
		b = new(HelloOK)
	case OpPing:
		b = new(Ping)
	case OpPong:
		b = new(Pong)
	case OpError:
		b = new(ErrorBody)
	case OpOK:
		b = new(OK)
	case OpDeclareQueue:
		b = new(DeclareQueue)
	case OpDeclareOK:
		b = new(DeclareOK)
	case OpPublish:
		b = new(Publish)
	case OpPublishOK:
		b = new(PublishOK)
	case OpDeleteQueue:
		b = new(DeleteQueue)
	case OpPurgeQueue:
		b = new(PurgeQueue)
	case OpPurgeOK:
		b = new(PurgeOK)
	case OpSubscribe:
		b = new(Subscribe)
	case OpSubscribeOK:
		b = new(SubscribeOK)
	case OpUnsubscribe:
		b = new(Unsubscribe)
	case OpSubClosed:
		b = new(SubClosed)
	case OpDeliver:
		b = new(Deliver)
	case OpAssignment:
		b = new(Assignment)
	case OpAck, OpNack, OpFail:
		b = &Settle{Kind: f.Op}
	case OpSettleResult:
		b = new(SettleResult)
	case OpExtend:
		b = new(Extend)
	case OpGoingAway:
		b = new(GoingAway)
	case OpReconcile:
		b = new(Reconcile)
	case OpReconcileResult:
		b = new(ReconcileResult)
	case OpEndSession:
		b = new(EndSession)
	case OpInflight:
		b = new(Inflight)
	case OpInflightResult:
		b = new(InflightResult)
	case OpMetadata:
		b = new(Metadata)
	case OpMetadataResult:
		b = new(MetadataResult)
	default:
		return nil, Errorf(CodeUnknownOp, "unknown op 0x%02x", uint8(f.Op))
	}
	d := &dec{b: f.Body}
	b.decode(d)
	if d.err != nil {
		var pe *Error
		if errors.As(d.err, &pe) {
			return nil, &Error{Code: pe.Code, Message: f.Op.String() + ": " + pe.Message}
		}
		return nil, d.err
	}
	return b, nil
}
