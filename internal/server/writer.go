package server

import (
	"runtime"
	"sync"
	"time"

	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/protocol"
)

// writer is a connection's outbound side and the session's Sink.
type writer struct {
	c *conn

	mu      sync.Mutex
	q       []session.Outbound
	closed  bool // no more Sends accepted
	spare   []session.Outbound
	pingSeq uint64

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
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return false
	}
	w.q = append(w.q, o)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return true
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
					w.q = append(w.q, session.Outbound{RequestID: w.pingSeq, Body: &protocol.Ping{}})
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
		for end < len(batch) && (end == start || len(buf) < writeBatchBytes) {
			o := &batch[end]
			buf = protocol.AppendFrame(buf, o.Flags, o.RequestID, o.Body)
			end++
		}
		err := c.nc.SetWriteDeadline(time.Now().Add(time.Duration(c.srv.cfg.WriteTimeoutMs) * time.Millisecond))
		if err == nil {
			_, err = c.nc.Write(buf)
		}
		if err != nil {
			w.requeue(batch[start:])
			c.noteWriteError(err)
			return buf, false
		}
		c.srv.stats.framesOut.Add(uint64(end - start))
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

func (w *writer) requeue(rest []session.Outbound) {
	w.mu.Lock()
	w.q = append(append([]session.Outbound(nil), rest...), w.q...)
	w.closed = true
	w.mu.Unlock()
}
