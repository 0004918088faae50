package queue

import (
	"encoding/binary"
	"fmt"
)

// eventVersion is the first byte of every encoded event. A reader refuses any
// other value rather than guess at a layout it does not know.
const eventVersion = 1

// Event payload layout. The kind is not in the payload: it is the seglog record
// type byte, passed separately to DecodeEvent. uv = unsigned varint, v = signed
// (zig-zag) varint, str = uv length followed by that many bytes.
//
//	+-----+-------------------------------------------------------------+
//	| ver |  kind-specific fields                                       |
//	| u8  |                                                             |
//	+-----+-------------------------------------------------------------+
//
//	Enqueue         published v | notBefore v | expiresAt v | producerSeq uv |
//	                producerID str | contentType str | key str |
//	                nHeaders uv | { key str | value str } * nHeaders | body str
//	Lease           offset uv | leaseID uv | attempt uv | deadline v | at v | owner str
//	Ack             offset uv | leaseID uv
//	Requeue         offset uv | leaseID uv | reason u8 | notBefore v | at v
//	DeadLetter      offset uv | leaseID uv | reason u8 | at v | target str
//	DeadLetterDone  offset uv | at v
//	Relocate        offset uv | the Enqueue fields above, published .. body
//	Extend          offset uv | leaseID uv | deadline v | at v
//	Assign          epoch uv | at v | cohort str | member str
//
// The body is last so a reader can alias it without copying.

// Marshal appends the binary payload of e to dst and returns the extended
// slice. The record type byte is e.Kind. An Enqueue with a nil Msg encodes an
// empty message.
func (e *Event) Marshal(dst []byte) []byte {
	dst = append(dst, eventVersion)
	switch e.Kind {
	case KindEnqueue:
		dst = appendMessage(dst, e.Msg)
	case KindRelocate:
		dst = binary.AppendUvarint(dst, e.Offset)
		dst = appendMessage(dst, e.Msg)
	case KindLease:
		dst = binary.AppendUvarint(dst, e.Offset)
		dst = binary.AppendUvarint(dst, e.LeaseID)
		dst = binary.AppendUvarint(dst, uint64(e.Attempt))
		dst = binary.AppendVarint(dst, e.DeadlineMs)
		dst = binary.AppendVarint(dst, e.AtMs)
		dst = appendStr(dst, e.Owner)
	case KindAck:
		dst = binary.AppendUvarint(dst, e.Offset)
		dst = binary.AppendUvarint(dst, e.LeaseID)
	case KindRequeue:
		dst = binary.AppendUvarint(dst, e.Offset)
		dst = binary.AppendUvarint(dst, e.LeaseID)
		dst = append(dst, byte(e.Reason))
		dst = binary.AppendVarint(dst, e.NotBeforeMs)
		dst = binary.AppendVarint(dst, e.AtMs)
	case KindDeadLetter:
		dst = binary.AppendUvarint(dst, e.Offset)
		dst = binary.AppendUvarint(dst, e.LeaseID)
		dst = append(dst, byte(e.Reason))
		dst = binary.AppendVarint(dst, e.AtMs)
		dst = appendStr(dst, e.Target)
	case KindDeadLetterDone:
		dst = binary.AppendUvarint(dst, e.Offset)
		dst = binary.AppendVarint(dst, e.AtMs)
	case KindExtend:
		dst = binary.AppendUvarint(dst, e.Offset)
		dst = binary.AppendUvarint(dst, e.LeaseID)
		dst = binary.AppendVarint(dst, e.DeadlineMs)
		dst = binary.AppendVarint(dst, e.AtMs)
	case KindAssign:
		dst = binary.AppendUvarint(dst, e.Epoch)
		dst = binary.AppendVarint(dst, e.AtMs)
		dst = appendStr(dst, e.Target)
		dst = appendStr(dst, e.Owner)
	}
	return dst
}

// appendMessage appends the Enqueue fields of m (nil: an empty message).
func appendMessage(dst []byte, m *Message) []byte {
	if m == nil {
		m = &Message{}
	}
	dst = binary.AppendVarint(dst, m.PublishedAtMs)
	dst = binary.AppendVarint(dst, m.NotBeforeMs)
	dst = binary.AppendVarint(dst, m.ExpiresAtMs)
	dst = binary.AppendUvarint(dst, m.ProducerSeq)
	dst = appendStr(dst, m.ProducerID)
	dst = appendStr(dst, m.ContentType)
	dst = appendBytes(dst, m.Key)
	dst = binary.AppendUvarint(dst, uint64(len(m.Headers)))
	for _, h := range m.Headers {
		dst = appendStr(dst, h.Key)
		dst = appendStr(dst, h.Value)
	}
	return appendBytes(dst, m.Body)
}

func appendStr(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst []byte, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// DecodeEvent parses a payload written by Marshal for record type kind. It
// never panics and never allocates more than a small multiple of len(b). The
// returned Msg.Key and Msg.Body alias b; strings are copied. Any malformed
// input, unknown kind or version, out-of-range reason or trailing byte yields
// an error wrapping ErrCorrupt.
func DecodeEvent(kind uint8, b []byte) (Event, error) {
	d := decoder{b: b}
	ev := Event{Kind: Kind(kind)}
	if v := d.byte(); d.err == nil && v != eventVersion {
		return Event{}, fmt.Errorf("%w: event version %d, want %d", ErrCorrupt, v, eventVersion)
	}
	switch ev.Kind {
	case KindEnqueue:
		ev.Msg = d.message()
	case KindRelocate:
		ev.Offset = d.uvarint()
		ev.Msg = d.message()
	case KindLease:
		ev.Offset = d.uvarint()
		ev.LeaseID = d.uvarint()
		a := d.uvarint()
		if a > 1<<32-1 {
			d.fail("attempt %d out of range", a)
		}
		ev.Attempt = uint32(a)
		ev.DeadlineMs = d.varint()
		ev.AtMs = d.varint()
		ev.Owner = string(d.bytes())
	case KindAck:
		ev.Offset = d.uvarint()
		ev.LeaseID = d.uvarint()
	case KindRequeue:
		ev.Offset = d.uvarint()
		ev.LeaseID = d.uvarint()
		ev.Reason = Reason(d.byte())
		if d.err == nil && !isRequeueReason(ev.Reason) {
			d.fail("requeue reason %d", ev.Reason)
		}
		ev.NotBeforeMs = d.varint()
		ev.AtMs = d.varint()
	case KindDeadLetter:
		ev.Offset = d.uvarint()
		ev.LeaseID = d.uvarint()
		ev.Reason = Reason(d.byte())
		if d.err == nil && !isDeadLetterReason(ev.Reason) {
			d.fail("dead-letter reason %d", ev.Reason)
		}
		ev.AtMs = d.varint()
		ev.Target = string(d.bytes())
	case KindDeadLetterDone:
		ev.Offset = d.uvarint()
		ev.AtMs = d.varint()
	case KindExtend:
		ev.Offset = d.uvarint()
		ev.LeaseID = d.uvarint()
		ev.DeadlineMs = d.varint()
		ev.AtMs = d.varint()
	case KindAssign:
		ev.Epoch = d.uvarint()
		ev.AtMs = d.varint()
		ev.Target = string(d.bytes())
		ev.Owner = string(d.bytes())
		if d.err == nil && (len(ev.Target) > GateFieldMax || len(ev.Owner) > GateFieldMax || ev.Target == "" && ev.Owner != "") {
			d.fail("assign cohort %q member %q", ev.Target, ev.Owner)
		}
	default:
		return Event{}, fmt.Errorf("%w: unknown event kind %d", ErrCorrupt, kind)
	}
	if d.err == nil && d.remaining() != 0 {
		d.fail("%d trailing bytes", d.remaining())
	}
	if d.err != nil {
		return Event{}, fmt.Errorf("decode %v event: %w", ev.Kind, d.err)
	}
	return ev, nil
}

// message reads the Enqueue fields; Key and Body alias the input.
func (d *decoder) message() *Message {
	m := &Message{}
	m.PublishedAtMs = d.varint()
	m.NotBeforeMs = d.varint()
	m.ExpiresAtMs = d.varint()
	m.ProducerSeq = d.uvarint()
	m.ProducerID = string(d.bytes())
	m.ContentType = string(d.bytes())
	m.Key = d.bytes()
	// Each header takes at least two bytes, which bounds the slice
	// allocated for a hostile count.
	n := d.uvarint()
	if n > uint64(d.remaining()/2) {
		d.fail("header count %d exceeds payload", n)
	}
	if d.err == nil && n > 0 {
		m.Headers = make([]Header, n)
		for i := range m.Headers {
			m.Headers[i].Key = string(d.bytes())
			m.Headers[i].Value = string(d.bytes())
		}
	}
	m.Body = d.bytes()
	return m
}

func isRequeueReason(r Reason) bool {
	return r == ReasonNack || r == ReasonLeaseExpired || r == ReasonReleased
}

func isDeadLetterReason(r Reason) bool {
	return r == ReasonFailed || r == ReasonRetriesExhausted || r == ReasonExpired || r == ReasonPurged
}

// decoder reads fields in order and latches the first error, so call sites
// read like the format table above and check once at the end.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) remaining() int { return len(d.b) - d.off }

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if d.remaining() < 1 {
		d.fail("truncated at byte %d", d.off)
		return 0
	}
	c := d.b[d.off]
	d.off++
	return c
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad uvarint at byte %d", d.off)
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad varint at byte %d", d.off)
		return 0
	}
	d.off += n
	return v
}

// bytes reads a length-prefixed field and returns it aliased into the input;
// nil when empty so decoded messages compare equal regardless of how the
// writer spelled "no key".
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(d.remaining()) {
		d.fail("field of %d bytes exceeds payload", n)
		return nil
	}
	if n == 0 {
		return nil
	}
	s := d.b[d.off : d.off+int(n) : d.off+int(n)]
	d.off += int(n)
	return s
}
