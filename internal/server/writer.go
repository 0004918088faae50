package server

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/protocol"
)

// writer is a connection's outbound side and the session's Sink.
//
// Byte cap. qBytes counts (in session.Outbound.Bytes) every frame queued and
// not yet handed to the socket, including the batch being written. When it
// reaches OutboundBytesMax the writer is full: the session's subscriptions stop
// taking deliveries (session.Throttle reports no room), and a clock starts.
// Below the cap the room it reports is what is left of the cap, so a partition
// leases only what fits. If the queue drains to half the cap the writer calls
// the session's drain callback and deliveries resume. If it has not drained
// within SlowConsumerTimeoutMs (or the write timeout, if shorter), the write in
// progress is cut by its deadline and the connection is closed as a slow
// consumer: a fatal ERROR slow_consumer when the stream is at a frame
// boundary, and in any case a log line and a counter. Frames still queued go
// back to the session (Detach), which keeps or releases their leases as for
// any disconnect.
type writer struct {
	c *conn

	mu       sync.Mutex
	q        []session.Outbound
	closed   bool // no more Sends accepted
	spare    []session.Outbound
	pingSeq  uint64
	qBytes   atomic.Int64 // Bytes of the frames queued or being written; changed under mu
	pausedAt time.Time    // when full was last set
	deadline time.Time    // of the write in progress or the last one
	onDrain  func()       // the session's wake, run when full clears
	full     atomic.Bool

	wake     chan struct{} // cap 1: frames were queued
	finishCh chan struct{} // closed: flush what is queued, close the socket, exit
	abortCh  chan struct{} // closed: exit at once
	done     chan struct{} // closed when the goroutine has exited
	finOnce  sync.Once
	abOnce   sync.Once
}

func newWriter(c *conn) *writer {
	return &writer{c: c, wake: make(chan struct{}, 1), finishCh: make(chan struct{}), abortCh: make(chan struct{}), done: make(chan struct{})}
}

// Send implements session.Sink. It never blocks.
func (w *writer) Send(o session.Outbound) bool {
	n := int64(o.Bytes())
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return false
	}
	w.q = append(w.q, o)
	if w.qBytes.Add(n) >= w.c.srv.cfg.OutboundBytesMax && !w.full.Load() {
		w.full.Store(true)
		w.pausedAt = time.Now()
		w.c.srv.stats.writerPauses.Add(1)
		// Cut short a write already waiting on a peer that stopped
		// reading; the writer applies the same bound to later writes.
		if d := w.pausedAt.Add(w.slowTimeout()); d.Before(w.deadline) {
			w.deadline = d
			w.c.nc.SetWriteDeadline(d)
		}
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return true
}

// RoomBytes implements session.Throttle: what may still be queued before the
// cap, or 0 while the writer is full (until it has drained to half the cap).
func (w *writer) RoomBytes() int64 {
	if w.full.Load() {
		return 0
	}
	return w.c.srv.cfg.OutboundBytesMax - w.qBytes.Load()
}

// SetOnDrain implements session.Throttle.
func (w *writer) SetOnDrain(f func()) {
	w.mu.Lock()
	w.onDrain = f
	w.mu.Unlock()
}

func (w *writer) slowTimeout() time.Duration {
	return time.Duration(w.c.srv.cfg.SlowConsumerTimeoutMs) * time.Millisecond
}

// writeDeadlineLocked is the deadline of the next write: WriteTimeoutMs from now, or
// sooner when the writer is full and its slow-consumer clock runs out first.
// Called with mu held.
func (w *writer) writeDeadlineLocked() time.Time {
	d := time.Now().Add(time.Duration(w.c.srv.cfg.WriteTimeoutMs) * time.Millisecond)
	if w.full.Load() {
		if p := w.pausedAt.Add(w.slowTimeout()); p.Before(d) {
			d = p
		}
	}
	return d
}

// wrote subtracts n written bytes and, when a full writer has drained to half
// its cap, clears full and wakes the session's subscriptions.
func (w *writer) wrote(n int64) {
	w.mu.Lock()
	left := w.qBytes.Add(-n)
	var wake func()
	if w.full.Load() && left <= w.c.srv.cfg.OutboundBytesMax/2 {
		w.full.Store(false)
		wake = w.onDrain
	}
	w.mu.Unlock()
	if wake != nil {
		wake()
	}
}

// Kick implements session.Sink: another connection took the session over.
func (w *writer) Kick() {
	w.c.log.Info("connection taken over by a resumed connection")
	w.abort()
}

// queued returns the current queue length.
func (w *writer) queued() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.q)
}

// finish asks the writer to flush what is queued, then close the socket. Later
// Sends are refused.
func (w *writer) finish() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.finOnce.Do(func() { close(w.finishCh) })
}

// abort closes the socket at once; unwritten frames stay queued for takeUnsent.
func (w *writer) abort() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.abOnce.Do(func() {
		close(w.abortCh)
		w.c.nc.Close()
	})
}

// takeUnsent returns the frames that were never written. Call after done.
func (w *writer) takeUnsent() []session.Outbound {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	q := w.q
	w.q = nil
	w.qBytes.Store(0)
	return q
}

// run is the writer goroutine.
func (w *writer) run() {
	defer close(w.done)
	c := w.c
	hb := time.Duration(c.srv.cfg.HeartbeatMs) * time.Millisecond
	var ping *time.Timer
	var pingC <-chan time.Time
	if hb > 0 {
		ping = time.NewTimer(hb)
		defer ping.Stop()
		pingC = ping.C
	}
	buf := make([]byte, 0, 4<<10)
	finishing := false
	for {
		w.mu.Lock()
		batch := w.q
		w.q = w.spare[:0]
		w.spare = nil
		w.mu.Unlock()
		if len(batch) == 0 {
			if finishing {
				c.nc.Close()
				return
			}
			select {
			case <-w.wake:
				// Replies and deliveries are produced in bursts (every
				// confirm of one log sync, every lease of one turn) by
				// a goroutine that may still be running on the other
				// core: yield once so the burst shares a write syscall.
				runtime.Gosched()
			case <-pingC:
				// No PING before HELLO_OK: the peer may not speak the protocol
				// yet, and the handshake timeout covers that phase. Queued
				// without the closed check: a PING is still useful while
				// finishing, and it is dropped with the rest on abort.
				if c.established.Load() {
					w.mu.Lock()
					w.pingSeq++
					o := session.Outbound{RequestID: w.pingSeq, Body: &protocol.Ping{}}
					w.q = append(w.q, o)
					w.qBytes.Add(int64(o.Bytes()))
					w.mu.Unlock()
				}
				ping.Reset(hb)
			case <-w.finishCh:
				finishing = true
			case <-w.abortCh:
				return
			}
			continue
		}
		var ok bool
		buf, ok = w.writeBatch(buf, batch)
		if !ok {
			return
		}
		clear(batch)
		w.mu.Lock()
		if w.spare == nil {
			w.spare = batch[:0]
		}
		w.mu.Unlock()
		if ping != nil {
			ping.Reset(hb)
		}
		c.signalReader()
		select {
		case <-w.abortCh:
			return
		default:
		}
	}
}

// writeBatch encodes and writes batch in chunks of up to writeBatchBytes, running
// after-write hooks as chunks land. On a write error the unwritten rest of the batch
// goes back to the front of the queue for takeUnsent and it reports false.
func (w *writer) writeBatch(buf []byte, batch []session.Outbound) ([]byte, bool) {
	c := w.c
	start := 0
	for start < len(batch) {
		buf = buf[:0]
		end := start
		var chunkBytes int64
		dropped := 0
		nowMs := time.Now().UnixMilli()
		for end < len(batch) && (end == start || len(buf) < writeBatchBytes) {
			o := &batch[end]
			if o.NotAfterMs != 0 && nowMs > o.NotAfterMs {
				// Its lease ran out while it waited here: written now it
				// would hand out a message another owner may have
				// leased again. It comes back through the queue.
				chunkBytes += int64(o.Bytes())
				o.Drop()
				o.AfterWrite = nil
				c.srv.stats.expiredUnsent.Add(1)
				dropped++
				end++
				continue
			}
			body := o.Body
			if d, ok := body.(*protocol.Deliver); ok && o.NotAfterMs != 0 {
				// The client learns how long the lease has left (a copy:
				// the session keeps the first for re-sends).
				c := *d
				c.LeaseMs = uint32(min(o.NotAfterMs-nowMs, 1<<31))
				body = &c
			}
			buf = protocol.AppendFrame(buf, o.Flags, o.RequestID, body)
			chunkBytes += int64(o.Bytes())
			end++
		}
		w.mu.Lock()
		w.deadline = w.writeDeadlineLocked()
		err := c.nc.SetWriteDeadline(w.deadline)
		w.mu.Unlock()
		n := 0
		if err == nil {
			n, err = c.nc.Write(buf)
		}
		if err != nil {
			w.requeue(batch[start:])
			if !w.slowConsumer(n, err) {
				c.noteWriteError(err)
			}
			// The reader may be blocked in a read that only the socket's
			// close ends; the connection is over either way.
			c.nc.Close()
			return buf, false
		}
		c.srv.stats.framesOut.Add(uint64(end - start - dropped))
		w.wrote(chunkBytes)
		for i := start; i < end; i++ {
			if f := batch[i].AfterWrite; f != nil {
				f()
			}
		}
		start = end
	}
	if cap(buf) > 4*writeBatchBytes {
		buf = make([]byte, 0, 4<<10) // do not pin a huge buffer after one big frame
	}
	return buf, true
}

// slowConsumer reports whether a failed write ran out of time while the writer
// was full: the peer did not read what it was sent, by the slow-consumer
// timeout or by the write timeout, whichever came first. If so it records the
// reason and, when none of the failed write's bytes went out (n == 0, so the
// stream is at a frame boundary), tries to tell the peer with a fatal ERROR
// slow_consumer, bounded by rejectWriteTimeoutMs.
func (w *writer) slowConsumer(n int, err error) bool {
	c := w.c
	w.mu.Lock()
	slow := w.full.Load() && errors.Is(err, os.ErrDeadlineExceeded)
	queued := w.qBytes.Load()
	fullMs := time.Since(w.pausedAt).Milliseconds()
	w.mu.Unlock()
	if !slow {
		return false
	}
	c.srv.stats.slowConsumers.Add(1)
	msg := fmt.Sprintf("%d bytes queued, at the %d-byte limit for %d ms without being read",
		queued, c.srv.cfg.OutboundBytesMax, fullMs)
	c.closeReason.CompareAndSwap(nil, protocol.CodeSlowConsumer.String()+": "+msg)
	c.log.Warn("slow consumer disconnected", "queued_bytes", queued, "outbound_bytes_max", c.srv.cfg.OutboundBytesMax,
		"full_ms", fullMs, "slow_consumer_timeout_ms", c.srv.cfg.SlowConsumerTimeoutMs)
	if n == 0 {
		c.nc.SetWriteDeadline(time.Now().Add(rejectWriteTimeoutMs * time.Millisecond))
		c.nc.Write(protocol.AppendFrame(nil, 0, 0, &protocol.ErrorBody{Code: protocol.CodeSlowConsumer, Message: msg, Fatal: true}))
	}
	return true
}

func (w *writer) requeue(rest []session.Outbound) {
	w.mu.Lock()
	w.q = append(append([]session.Outbound(nil), rest...), w.q...)
	w.closed = true
	w.mu.Unlock()
}
