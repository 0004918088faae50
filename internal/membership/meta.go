package membership

import (
	"encoding/binary"
	"fmt"
)

// Meta is what a node tells its peers about itself, carried in
// memberlist's node metadata.
type Meta struct {
	// NodeID is the node's stable id (see the node identity in the data
	// directory).
	NodeID string
	// ClientAddr is the address clients connect to.
	ClientAddr string
	// PeerAddr is the address of the node's raft transport.
	PeerAddr string
	// Leaving is set by Leave before the node leaves, so that peers tell
	// a leave from a crash (memberlist reports both the same way).
	Leaving bool
	// Boot names this run of the node's process: a new random value at
	// every start, so peers tell a node that restarted from one that is
	// still the same process (a node that left and came back from one
	// still handing its replicas over). Zero from a node of metadata
	// version 1, which sends none.
	Boot uint64
}

// metaBytesMax is memberlist's limit on node metadata (memberlist.MetaMaxSize).
const metaBytesMax = 512

// metaVersion is the first byte of an encoded Meta.
//
//	+---------+----------+--------+--------+--------+------------+--------+----------+------------+
//	| version | flags u8 | len u8 | NodeID | len u8 | ClientAddr | len u8 | PeerAddr | Boot u64be |
//	+---------+----------+--------+--------+--------+------------+--------+----------+------------+
//
// flags bit 0 is Leaving; the other bits are zero. Version 1 is the same
// without Boot; it is still read (Boot zero), and never sent.
//
// Later versions only append: a release that adds a field (or a flag)
// sends a higher version whose first bytes are version 2's, and a reader
// of this release takes version 2's fields from it and ignores the rest,
// so a node of this release and one of the next understand each other in
// a rolling upgrade.
const (
	metaVersion   = 2
	metaVersionV1 = 1
)

// fieldBytesMax bounds each field; three of them and their lengths fit in
// metaBytesMax.
const fieldBytesMax = 160

const flagLeaving = 1

func (m Meta) encode() ([]byte, error) {
	var flags byte
	if m.Leaving {
		flags |= flagLeaving
	}
	b := []byte{metaVersion, flags}
	for _, f := range []struct{ name, v string }{
		{"node id", m.NodeID}, {"client address", m.ClientAddr}, {"peer address", m.PeerAddr},
	} {
		if len(f.v) > fieldBytesMax {
			return nil, fmt.Errorf("%w: %s is %d bytes, at most %d", ErrBadConfig, f.name, len(f.v), fieldBytesMax)
		}
		b = append(b, byte(len(f.v)))
		b = append(b, f.v...)
	}
	return binary.BigEndian.AppendUint64(b, m.Boot), nil
}

// decodeMeta reads a peer's metadata. Whatever a peer sends, it returns an
// error and never panics.
func decodeMeta(b []byte) (Meta, error) {
	if len(b) == 0 {
		return Meta{}, fmt.Errorf("%w: empty", ErrBadMeta)
	}
	version := b[0]
	if version < metaVersionV1 {
		return Meta{}, fmt.Errorf("%w: version %d, want %d or later", ErrBadMeta, b[0], metaVersionV1)
	}
	// A later version's flags this release does not know are its own.
	if len(b) < 2 || version <= metaVersion && b[1]&^flagLeaving != 0 {
		return Meta{}, fmt.Errorf("%w: missing or unknown flags", ErrBadMeta)
	}
	leaving := b[1]&flagLeaving != 0
	b = b[2:]
	var out [3]string
	for i := range out {
		if len(b) == 0 {
			return Meta{}, fmt.Errorf("%w: field %d missing", ErrBadMeta, i)
		}
		n := int(b[0])
		if n > len(b)-1 || n > fieldBytesMax {
			return Meta{}, fmt.Errorf("%w: field %d truncated or too long", ErrBadMeta, i)
		}
		out[i] = string(b[1 : 1+n])
		b = b[1+n:]
	}
	var boot uint64
	if version >= metaVersion {
		if len(b) < 8 {
			return Meta{}, fmt.Errorf("%w: boot truncated", ErrBadMeta)
		}
		boot, b = binary.BigEndian.Uint64(b), b[8:]
	}
	if len(b) != 0 && version <= metaVersion {
		return Meta{}, fmt.Errorf("%w: %d trailing bytes", ErrBadMeta, len(b))
	}
	return Meta{NodeID: out[0], ClientAddr: out[1], PeerAddr: out[2], Leaving: leaving, Boot: boot}, nil
}
