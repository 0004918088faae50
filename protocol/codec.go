package protocol

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// Limits that apply while decoding any body, independent of the negotiated limits.
// They keep a hostile frame from making the decoder allocate far more than the
// frame itself: every list item costs at least one byte, so a count larger than the
// remaining bytes is rejected before any allocation.
const (
	// listItemsMax caps the number of items in any list field.
	listItemsMax = 1 << 16
	// headersMax caps the number of headers on one message.
	headersMax = 256
)

// enc appends fields to a body.
type enc struct{ b []byte }

func (e *enc) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) varint(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *enc) u8(v uint8)       { e.b = append(e.b, v) }
func (e *enc) boolean(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}
func (e *enc) bytes(v []byte) { e.uvarint(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) str(v string)   { e.uvarint(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) headers(hs []Header) {
	e.uvarint(uint64(len(hs)))
	for _, h := range hs {
		e.str(h.Key)
		e.str(h.Value)
	}
}

// dec reads fields from a body. The first failure is sticky: later reads return
// zero values and Err reports the first problem, so decoders read straight through
// and check once.
type dec struct {
	b     []byte
	field string
	err   error
}

func (d *dec) fail(what string) {
	if d.err == nil {
		d.err = &Error{Code: CodeBadFrame, Message: fmt.Sprintf("field %s: %s", d.field, what)}
	}
}

func (d *dec) at(field string) *dec { d.field = field; return d }

func (d *dec) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// u32 reads a uvarint that must fit in 32 bits.
func (d *dec) u32() uint32 {
	v := d.uvarint()
	if v > 0xFFFFFFFF {
		d.fail("value exceeds 32 bits")
		return 0
	}
	return uint32(v)
}

// i32 reads a zig-zag varint that must fit in 32 bits.
func (d *dec) i32() int32 {
	v := d.varint()
	if v < -1<<31 || v > 1<<31-1 {
		d.fail("value exceeds 32 bits")
		return 0
	}
	return int32(v)
}

func (d *dec) u8() uint8 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.fail("truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) boolean() bool {
	switch d.u8() {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail("bool must be 0 or 1")
		return false
	}
}

// bytes returns a sub-slice of the body (no copy). Callers that keep the value past
// the frame's lifetime must copy it.
func (d *dec) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("length exceeds frame")
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) str() string {
	v := d.bytes()
	if d.err != nil {
		return ""
	}
	if !utf8.Valid(v) {
		d.fail("string is not valid UTF-8")
		return ""
	}
	return string(v)
}

// count reads a list length, bounded by max and by the bytes left (each item takes
// at least minItemBytes).
func (d *dec) count(max int, minItemBytes int) int {
	n := d.uvarint()
	if d.err != nil {
		return 0
	}
	if n > uint64(max) {
		d.fail(fmt.Sprintf("list of %d items exceeds %d", n, max))
		return 0
	}
	if n*uint64(minItemBytes) > uint64(len(d.b)) {
		d.fail("list longer than frame")
		return 0
	}
	return int(n)
}

func (d *dec) headers() []Header {
	n := d.count(headersMax, 2)
	if n == 0 {
		return nil
	}
	hs := make([]Header, n)
	for i := range hs {
		hs[i].Key = d.str()
		hs[i].Value = d.str()
	}
	if d.err != nil {
		return nil
	}
	return hs
}

// optional reports whether another field is present. Fields added to a body in a
// later revision of version 1 are read only when present, so older encoders stay
// readable.
func (d *dec) optional() bool { return d.err == nil && len(d.b) > 0 }
