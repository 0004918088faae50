package checker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The workload's message body carries the message's ID, so that a delivery can
// be traced to its publish, and a checksum, so that a body damaged anywhere
// between producer and consumer is caught:
//
//	0        4     5            5+n          13+n        15+n          15+n+p       19+n+p
//	+--------+-----+------------+------------+-----------+-------------+------------+
//	| "SCB1" | n   | producer   | seq (u64)  | p (u16)   | padding     | crc32c     |
//	+--------+-----+------------+------------+-----------+-------------+------------+
//	  magic    u8    n bytes      big-endian   big-endian  p bytes,      big-endian, over
//	                                                       byte i =      every byte before it
//	                                                       seq+i mod 256
const (
	bodyMagic         = "SCB1"
	bodyProducerMax   = 255
	bodyPaddingMax    = 60 << 10
	bodyOverheadBytes = 4 + 1 + 8 + 2 + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrBadBody is matched (errors.Is) by every DecodeBody failure.
var ErrBadBody = errors.New("checker: body does not verify")

// AppendBody appends the body of message id, padded with paddingBytes bytes,
// to dst. It returns an error when the producer name or padding is too long.
func AppendBody(dst []byte, id ID, paddingBytes int) ([]byte, error) {
	if len(id.Producer) > bodyProducerMax {
		return dst, fmt.Errorf("checker: producer name of %d bytes exceeds %d", len(id.Producer), bodyProducerMax)
	}
	if paddingBytes < 0 || paddingBytes > bodyPaddingMax {
		return dst, fmt.Errorf("checker: padding of %d bytes outside 0..%d", paddingBytes, bodyPaddingMax)
	}
	start := len(dst)
	dst = append(dst, bodyMagic...)
	dst = append(dst, byte(len(id.Producer)))
	dst = append(dst, id.Producer...)
	dst = binary.BigEndian.AppendUint64(dst, id.Seq)
	dst = binary.BigEndian.AppendUint16(dst, uint16(paddingBytes))
	for i := 0; i < paddingBytes; i++ {
		dst = append(dst, byte(id.Seq+uint64(i)))
	}
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli)), nil
}

// DecodeBody verifies a body written by AppendBody and returns its ID.
func DecodeBody(b []byte) (ID, error) {
	if len(b) < bodyOverheadBytes || string(b[:4]) != bodyMagic {
		return ID{}, fmt.Errorf("%w: %d bytes, no magic", ErrBadBody, len(b))
	}
	sumAt := len(b) - 4
	if got, want := crc32.Checksum(b[:sumAt], castagnoli), binary.BigEndian.Uint32(b[sumAt:]); got != want {
		return ID{}, fmt.Errorf("%w: crc32c %08x, want %08x", ErrBadBody, got, want)
	}
	n := int(b[4])
	if 5+n+8+2 > sumAt {
		return ID{}, fmt.Errorf("%w: producer length %d overruns the body", ErrBadBody, n)
	}
	id := ID{Producer: string(b[5 : 5+n])}
	id.Seq = binary.BigEndian.Uint64(b[5+n:])
	p := int(binary.BigEndian.Uint16(b[13+n:]))
	if 15+n+p != sumAt {
		return ID{}, fmt.Errorf("%w: padding length %d does not match the body", ErrBadBody, p)
	}
	for i := 0; i < p; i++ {
		if b[15+n+i] != byte(id.Seq+uint64(i)) {
			return ID{}, fmt.Errorf("%w: padding byte %d of %s", ErrBadBody, i, id)
		}
	}
	return id, nil
}
