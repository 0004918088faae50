package partition

import (
	"errors"
	"fmt"

	"github.com/sinewmq/sinew/internal/queue"
)

// Relocation. Retention may drop a log segment only when nothing needs it:
// the checkpoint covers it and no unsettled message's body is in it. Without
// more, one message delayed for a month (or a poison message nobody settles)
// would pin its own segment and, since segments go oldest first, every
// segment after it. So before each periodic checkpoint, and at Close, the
// actor copies the bodies of the few live messages left in the oldest sealed
// segments to the log's tail: a Relocate record carries the message's
// offset, which stays its identity (consumers and settles name it), and its
// whole Enqueue payload. The queue applies it like any event (the body of
// offset X now lives at LSN Y), so it is replayed after a crash and carried
// in the checkpoint, and retention then drops segments below
// min(checkpoint, lowest live body LSN) (queue.State.BodyFloor).
//
// The policy is bounded and only copies what frees space:
//
//   - sealed segments only, oldest first, and only while each holds at most
//     one live body per relocateLiveFraction records. A mostly live segment
//     is a real backlog: copying it would double its disk for nothing, and
//     retention cannot pass it anyway, so the walk stops there;
//   - at most relocateRecordsMax records and relocateBytesMax payload bytes
//     per pass, so a pass costs a bounded, small fraction of the
//     CheckpointEveryRecords records between passes. A message still live
//     when its new segment is sealed and sparse is copied again a pass
//     later: a month-long delay costs one copy per checkpoint interval.
//
// A crash before the Relocate record is durable leaves the body where it
// was, and its segment is dropped only after a checkpoint that follows a
// sync of the new record, so no body is ever without a durable home.
const (
	relocateRecordsMax   = 1024
	relocateBytesMax     = 4 << 20
	relocateLiveFraction = 16
)

// relocate copies the live bodies of sparse, sealed old segments to the tail
// of the log (see Relocation) and returns the records appended. A body it
// cannot read ends the pass with a logged error (the message stays where it
// is); an append error is returned, and fails the partition. Actor only (or
// Close, once the actor has stopped).
func (p *Partition) relocate() (int, error) {
	segs := p.log.Segments()
	if len(segs) < 2 {
		return 0, nil
	}
	fraction := uint64(relocateLiveFraction)
	switch {
	case p.cfg.relocateLiveFraction < 0:
		return 0, nil
	case p.cfg.relocateLiveFraction > 0:
		fraction = uint64(p.cfg.relocateLiveFraction)
	}
	sealedEnd := segs[len(segs)-1].Base
	locs := p.st.OldestBodies(p.relocs[:0], sealedEnd, relocateRecordsMax)
	p.relocs = locs
	// Take whole segments, oldest first, while each is sparse. The last
	// segment counted may have more live bodies than locs holds (the query
	// stops at relocateRecordsMax); its partial count only makes it look
	// sparser, which the per-pass bounds keep cheap.
	n := 0
	for _, sg := range segs[:len(segs)-1] {
		if n == len(locs) {
			break
		}
		k := n
		for k < len(locs) && locs[k].LSN <= sg.Last {
			k++
		}
		if uint64(k-n)*fraction > sg.Last-sg.Base+1 {
			break
		}
		n = k
	}
	appended, copied := 0, 0
	for _, loc := range locs[:n] {
		if copied >= relocateBytesMax {
			break
		}
		m, size, err := p.messageSized(loc.Offset)
		if err != nil {
			p.logger.Error("cannot read a live message to relocate it; retention stays behind it",
				"offset", loc.Offset, "body_lsn", loc.LSN, "err", err)
			break
		}
		evs, err := p.st.Relocate(p.evs[:0], loc.Offset)
		if err != nil {
			if ferr := p.flush(); ferr != nil {
				err = errors.Join(err, ferr)
			}
			return appended, fmt.Errorf("relocate offset %d: %w", loc.Offset, err)
		}
		evs[0].Msg = m
		appended += p.emit(evs, nil)
		copied += size
	}
	p.relocated += uint64(appended)
	if err := p.flush(); err != nil {
		return appended, err
	}
	return appended, nil
}

// retentionFloor is the LSN below which no segment is needed once a
// checkpoint covering covers is durable: the checkpoint replaces the log
// below it, and nothing live has its body there.
func (p *Partition) retentionFloor(covers uint64) uint64 {
	return min(covers, p.st.BodyFloor())
}

// bodyMessage decodes the message of offset from the record read at its
// body location (lsn): its own Enqueue record or a Relocate record copying
// it. Anything else means the queue and the log disagree.
func bodyMessage(offset uint64, typ uint8, lsn uint64, payload []byte) (*queue.Message, error) {
	switch queue.Kind(typ) {
	case queue.KindEnqueue:
		if lsn != offset {
			return nil, fmt.Errorf("lsn %d holds the enqueue of offset %d, not of %d", lsn, lsn, offset)
		}
	case queue.KindRelocate:
	default:
		return nil, fmt.Errorf("lsn %d holds a %v record, not the body of offset %d", lsn, queue.Kind(typ), offset)
	}
	ev, err := queue.DecodeEvent(typ, payload)
	if err != nil {
		return nil, err
	}
	if ev.Kind == queue.KindRelocate && ev.Offset != offset {
		return nil, fmt.Errorf("lsn %d relocates offset %d, not %d", lsn, ev.Offset, offset)
	}
	return ev.Msg, nil
}
