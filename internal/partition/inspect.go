package partition

import (
	"context"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/protocol"
)

// Inspection for operators: Peek reads unsettled messages without leasing
// or settling anything; Discard removes one queued message, as a purge of
// that one message would.

// PeekScanMax bounds how many offsets one Peek walks, so a request over a
// long settled stretch cannot hold the actor for long. A Peek that stops
// there returns its position in Next, and the caller goes on from it.
const PeekScanMax = 16384

// ErrNotQueued refuses a Discard of a message that is not ready or
// delayed: settled, leased to a consumer, or being dead-lettered.
var ErrNotQueued = &protocol.Error{Code: protocol.CodeConflict, Message: "message is not queued (settled, leased or being dead-lettered)"}

// Peeked is one unsettled message seen by Peek. Msg's Key and Body alias a
// buffer nobody modifies: read them, never write.
type Peeked struct {
	Info queue.Info
	Msg  *queue.Message
	// Err is set, and Msg nil, when the body could not be read.
	Err error
}

// PeekResult is what Peek found.
type PeekResult struct {
	Messages []Peeked
	// Next is the offset to continue from; NextLSN when the walk reached
	// the end of the log.
	Next uint64
	// NextLSN is the offset the next record will get.
	NextLSN uint64
}

// Peek returns up to limit unsettled messages at offsets from from upward,
// each with its state. It runs on the actor goroutine between turns, so its
// view is consistent, and it changes nothing: no lease, no settle, no
// record. It walks at most PeekScanMax offsets. A parked or failed
// partition answers ErrUnavailable; ctx bounds the wait for the actor.
func (p *Partition) Peek(ctx context.Context, from uint64, limit int) (PeekResult, error) {
	if err := p.Unavailable(); err != nil {
		return PeekResult{}, err
	}
	type answer struct{ r PeekResult }
	ch := make(chan answer, 1)
	err := p.control(control{kind: ctlInspect, fn: func() {
		ch <- answer{p.peek(from, limit)}
	}})
	if err != nil {
		return PeekResult{}, err
	}
	select {
	case a := <-ch:
		return a.r, nil
	case <-ctx.Done():
		return PeekResult{}, ctx.Err()
	}
}

// peek is Peek on the actor goroutine.
func (p *Partition) peek(from uint64, limit int) PeekResult {
	now := p.nowMs()
	next := p.st.NextLSN()
	off := max(from, p.st.Frontier())
	var out []Peeked
	for scanned := 0; off < next && len(out) < limit && scanned < PeekScanMax; off, scanned = off+1, scanned+1 {
		info, ok := p.st.Lookup(off, now)
		if !ok || info.State == queue.StateSettled {
			continue
		}
		m, err := p.message(off)
		out = append(out, Peeked{Info: info, Msg: m, Err: err})
	}
	return PeekResult{Messages: out, Next: off, NextLSN: next}
}

// Discard removes the message at offset if it is queued (ready or
// delayed), with the record a purge writes for it. done is called once the
// removal is durable, or with ErrNotQueued when the message is settled,
// leased or being dead-lettered (nothing is written then).
func (p *Partition) Discard(offset uint64, done func(error)) {
	if err := p.Unavailable(); err != nil {
		done(err)
		return
	}
	p.send(command{kind: cmdDiscard, offset: offset, settled: done}, done)
}

// LeaseCurrent reports whether a settle of offset by leaseID would still
// take effect: the lease is held, or it ended without a settle (expired,
// released) and the message has not been leased since, or it ACKed the
// message and a repeat of that ACK is answered ok (the client may not have
// had the answer). A session resumed after a restart asks it about the
// deliveries its client still holds that the broker did not give back, so
// that the client can drop the stale ones before the application sees
// them. A replica that does not lead answers ErrNotLeader: only the
// leader's state is current.
func (p *Partition) LeaseCurrent(ctx context.Context, offset, leaseID uint64) (bool, error) {
	if err := p.Unavailable(); err != nil {
		return false, err
	}
	type answer struct {
		current bool
		err     error
	}
	ch := make(chan answer, 1)
	err := p.control(control{kind: ctlInspect, fn: func() {
		if !p.leads {
			ch <- answer{err: ErrNotLeader}
			return
		}
		in, ok := p.st.Lookup(offset, p.nowMs())
		cur := ok && (in.State == queue.StateInflight && in.LeaseID == leaseID ||
			(in.State == queue.StateReady || in.State == queue.StateDelayed) && in.EndedLeaseID == leaseID) ||
			p.acked.by(offset, leaseID) // its ACK is answered ok again
		ch <- answer{current: cur}
	}})
	if err != nil {
		return false, err
	}
	select {
	case a := <-ch:
		return a.current, a.err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}
