package sessionstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"
)

// Checkpoint file layout (DataDir/sessions/checkpoint), written with
// vfs.WriteFileAtomic, so a crash leaves the old or the new one, whole:
//
//	+--------+-----+--------+--------+-------------+----------+=========+--------+
//	| "SNSS" | ver | covers | boot   | next_sub_id | sessions | session | crc32c |
//	| 4 B    | u8  | u64 LE | u64 LE | u64 LE      | uvarint  | ...     | u32 LE |
//	+--------+-----+--------+--------+-------------+----------+=========+--------+
//	session: client_id str | owner_id str | token_hash 32 B | principal str |
//	         subs uvarint | sub ...
//	sub: as in a subscribe record after the client id (record.go), then
//	     cohort str | member str (version >= 3; "" for a plain one)
//	ver 1 (still read) has no principal: its sessions get principal "".
//	ver 2 (still read) has no cohorts: its subscriptions are plain.
//	crc32c (Castagnoli) covers every byte before it.
//
// covers is the log's NextLSN when the checkpoint was taken: it reflects
// every record below it, and Open replays the log from there.
const (
	ckptMagic   = "SNSS"
	ckptVersion = 3
	// ckptVersionCohorts is the first version whose subscriptions carry
	// their cohort and member.
	ckptVersionCohorts = 3
	// ckptVersionNoPrincipal is the version before sessions recorded their
	// principal; Open still reads it.
	ckptVersionNoPrincipal = 1
	ckptHeader             = 4 + 1 + 8 + 8 + 8
	// ckptBytesMax bounds what Open reads, so a damaged file cannot make
	// it allocate without limit.
	ckptBytesMax = 1 << 30
	// subsPerSessionMax bounds a decoded session's subscriptions (the
	// registry allows far fewer).
	subsPerSessionMax = 1 << 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func encodeCheckpoint(st *state, covers uint64) []byte {
	b := make([]byte, 0, 256)
	b = append(b, ckptMagic...)
	b = append(b, ckptVersion)
	b = binary.LittleEndian.AppendUint64(b, covers)
	b = binary.LittleEndian.AppendUint64(b, st.boot)
	b = binary.LittleEndian.AppendUint64(b, st.nextSubID)
	b = binary.AppendUvarint(b, uint64(len(st.sessions)))
	for _, id := range slices.Sorted(maps.Keys(st.sessions)) {
		s := st.sessions[id]
		b = appendStr(b, s.ClientID)
		b = appendStr(b, s.OwnerID)
		b = append(b, s.TokenHash[:]...)
		b = appendStr(b, s.Principal)
		b = binary.AppendUvarint(b, uint64(len(s.Subs)))
		for _, sub := range s.Subs {
			b = appendCohort(appendSub(b, sub), sub)
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func decodeCheckpoint(b []byte) (*state, uint64, error) {
	if len(b) < ckptHeader+1+4 || string(b[:4]) != ckptMagic {
		return nil, 0, errors.New("not a session checkpoint")
	}
	ver := b[4]
	if ver < ckptVersionNoPrincipal || ver > ckptVersion {
		return nil, 0, fmt.Errorf("session checkpoint version %d, want %d to %d", ver, ckptVersionNoPrincipal, ckptVersion)
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, 0, errors.New("session checkpoint checksum mismatch")
	}
	st := newState()
	covers := binary.LittleEndian.Uint64(b[5:])
	st.boot = binary.LittleEndian.Uint64(b[13:])
	st.nextSubID = binary.LittleEndian.Uint64(b[21:])
	r := &reader{b: body[ckptHeader:]}
	n := r.uvarint()
	for i := uint64(0); i < n && r.err == nil; i++ {
		s := &Session{ClientID: r.str(), OwnerID: r.str()}
		copy(s.TokenHash[:], r.bytes(TokenHashBytes))
		if ver != ckptVersionNoPrincipal {
			s.Principal = r.str()
		}
		k := r.uvarint()
		if r.err == nil && k > subsPerSessionMax {
			r.err = fmt.Errorf("session %q has %d subscriptions", s.ClientID, k)
		}
		for j := uint64(0); j < k && r.err == nil; j++ {
			sub := r.sub()
			if ver >= ckptVersionCohorts {
				r.cohort(&sub)
			}
			s.Subs = append(s.Subs, sub)
		}
		if r.err == nil {
			st.sessions[s.ClientID] = s
		}
	}
	if r.err != nil {
		return nil, 0, fmt.Errorf("session checkpoint: %w", r.err)
	}
	if len(r.b) != 0 {
		return nil, 0, fmt.Errorf("session checkpoint: %d trailing bytes", len(r.b))
	}
	return st, covers, nil
}
