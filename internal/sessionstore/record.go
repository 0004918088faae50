package sessionstore

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Record types in the log. Every payload starts with the client id.
//
//	create:      client_id str | owner_id str | token_hash 32 B   (written
//	             before sessions had a principal; still read: principal "")
//	create_owned: client_id str | owner_id str | token_hash 32 B | principal str
//	subscribe:   client_id str | sub_id uvarint | topic str | group str |
//	             partition varint | ack_mode u8 | prefetch uvarint
//	subscribe_cohort: the subscribe fields | cohort str | member str
//	unsubscribe: client_id str | sub_id uvarint
//	end:         client_id str
//
// str is a uvarint length followed by that many bytes. Types are never
// reused; an unknown type fails Open (the log is damaged or newer).
const (
	recCreate      uint8 = 1
	recSubscribe   uint8 = 2
	recUnsubscribe uint8 = 3
	recEnd         uint8 = 4
	recCreateOwned uint8 = 5
	// recSubscribeCohort is recSubscribe for a cohort member.
	recSubscribeCohort uint8 = 6
)

// stringBytesMax bounds a decoded string: names are at most 255 bytes and
// ids shorter, so anything longer is damage.
const stringBytesMax = 1024

// TokenHashBytes is the size of a resume token's hash.
const TokenHashBytes = 32

// Sub is one subscription's stable identity.
type Sub struct {
	ID        uint64
	Topic     string
	Group     string
	Partition int32 // -1: every partition
	AckMode   uint8
	Prefetch  uint32
	// Cohort and Member: the cohort the subscription is a member of, and
	// its member id; "" for a plain subscription.
	Cohort, Member string
}

// Session is what the store keeps of one session.
type Session struct {
	ClientID string
	OwnerID  string
	// Principal is the owner of the session (auth.Principal.Owner of the
	// connection that opened it); "" for a session recorded before
	// sessions had one.
	Principal string
	TokenHash [TokenHashBytes]byte
	Subs      []Sub // ordered by ID
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendSub(b []byte, s Sub) []byte {
	b = binary.AppendUvarint(b, s.ID)
	b = appendStr(b, s.Topic)
	b = appendStr(b, s.Group)
	b = binary.AppendVarint(b, int64(s.Partition))
	b = append(b, s.AckMode)
	return binary.AppendUvarint(b, uint64(s.Prefetch))
}

// appendCohort appends a subscription's cohort fields.
func appendCohort(b []byte, s Sub) []byte { return appendStr(appendStr(b, s.Cohort), s.Member) }

func (r *reader) cohort(s *Sub) { s.Cohort, s.Member = r.str(), r.str() }

// reader decodes a payload; the first error sticks.
type reader struct {
	b   []byte
	err error
}

var errShort = errors.New("record too short")

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte1() uint8 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.err = errShort
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.err = errShort
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) str() string {
	n := r.uvarint()
	if r.err == nil && n > stringBytesMax {
		r.err = fmt.Errorf("string of %d bytes (at most %d)", n, stringBytesMax)
	}
	return string(r.bytes(int(n)))
}

func (r *reader) sub() Sub {
	s := Sub{ID: r.uvarint(), Topic: r.str(), Group: r.str()}
	p := r.varint()
	if r.err == nil && (p < -1 || p > 1<<31-1) {
		r.err = fmt.Errorf("partition %d", p)
	}
	s.Partition = int32(p)
	s.AckMode = r.byte1()
	pf := r.uvarint()
	if r.err == nil && pf > 1<<32-1 {
		r.err = fmt.Errorf("prefetch %d", pf)
	}
	s.Prefetch = uint32(pf)
	return s
}

// state is the store's view: live sessions and the id counters.
type state struct {
	sessions map[string]*Session
	// nextSubID is above every subscription id ever recorded.
	nextSubID uint64
	boot      uint64
}

func newState() *state { return &state{sessions: make(map[string]*Session), nextSubID: 1} }

// apply applies one record. A record about an unknown session is ignored:
// its create may have been lost to a crash (create is not synced on its
// own), and then nothing can resume it anyway.
func (st *state) apply(typ uint8, payload []byte) error {
	r := &reader{b: payload}
	id := r.str()
	switch typ {
	case recCreate, recCreateOwned:
		s := &Session{ClientID: id, OwnerID: r.str()}
		copy(s.TokenHash[:], r.bytes(TokenHashBytes))
		if typ == recCreateOwned {
			s.Principal = r.str()
		}
		if r.err == nil {
			st.sessions[id] = s
		}
	case recSubscribe, recSubscribeCohort:
		sub := r.sub()
		if typ == recSubscribeCohort {
			r.cohort(&sub)
		}
		if r.err != nil {
			break
		}
		st.nextSubID = max(st.nextSubID, sub.ID+1)
		if s := st.sessions[id]; s != nil {
			s.Subs = removeSub(s.Subs, sub.ID)
			s.Subs = insertSub(s.Subs, sub)
		}
	case recUnsubscribe:
		subID := r.uvarint()
		if s := st.sessions[id]; s != nil && r.err == nil {
			s.Subs = removeSub(s.Subs, subID)
		}
	case recEnd:
		if r.err == nil {
			delete(st.sessions, id)
		}
	default:
		return fmt.Errorf("unknown session record type %d", typ)
	}
	if r.err != nil {
		return fmt.Errorf("session record type %d: %w", typ, r.err)
	}
	if len(r.b) != 0 {
		return fmt.Errorf("session record type %d: %d trailing bytes", typ, len(r.b))
	}
	return nil
}

func removeSub(subs []Sub, id uint64) []Sub {
	for i := range subs {
		if subs[i].ID == id {
			return append(subs[:i], subs[i+1:]...)
		}
	}
	return subs
}

func insertSub(subs []Sub, s Sub) []Sub {
	i := 0
	for i < len(subs) && subs[i].ID < s.ID {
		i++
	}
	subs = append(subs, Sub{})
	copy(subs[i+1:], subs[i:])
	subs[i] = s
	return subs
}

func appendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }
