package partition

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/sinewmq/sinew/internal/delivery"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
)

// undelivered returns the leases granted to c whose deliveries wait in a
// stage, not yet handed to c: offset to lease id.
func (p *Partition) undelivered(c Consumer) map[uint64]uint64 {
	var m map[uint64]uint64
	add := func(st *stage) {
		for _, d := range st.deliveries {
			if d.c == c {
				if m == nil {
					m = make(map[uint64]uint64)
				}
				m[d.offset] = d.leaseID
			}
		}
	}
	add(&p.open)
	if p.syncBusy {
		// The syncer reads only the stage's records and WAL entries.
		add(&p.syncing)
	}
	for i := range p.committing {
		add(&p.committing[i])
	}
	return m
}

// deadLetterDone books the confirmation of a dead-letter copy and reports
// whether the copy is durable, so its message is settled; a failed copy is
// retried after deadLetterRetryMs.
func (p *Partition) deadLetterDone(m control, now int64) bool {
	d, ok := p.deadLetters[m.offset]
	if !ok {
		return false
	}
	d.inflight = false
	p.dlInflight--
	if m.err != nil {
		d.retryAtMs = now + deadLetterRetryMs
		p.logger.Warn("dead-letter copy failed; will retry", "offset", m.offset, "err", m.err)
		return false
	}
	delete(p.deadLetters, m.offset)
	return true
}

// adopt makes c the holder of its recovered leases and delivers them (see
// Partition.Adopt). It appends nothing: the leases are in the log already.
func (p *Partition) adopt(c Consumer, now int64) int {
	mine := p.adoptable(c, now)
	if len(mine) == 0 {
		return 0
	}
	if a, ok := c.(Adopter); ok {
		a.AdoptCredit(len(mine))
	}
	n := 0
	for _, in := range mine {
		m, err := p.message(in.Offset)
		if err != nil {
			// The lease stands and expires; the consumer never sees it.
			p.logger.Error("cannot read adopted message", "offset", in.Offset, "err", err)
			c.RefundCredit(1)
			continue
		}
		p.holders[in.Offset] = holder{c: c, leaseID: in.LeaseID}
		c.Deliver(Delivery{
			Offset: in.Offset, LeaseID: in.LeaseID, Attempt: in.Attempt,
			PublishedAtMs: m.PublishedAtMs, Key: m.Key, Headers: delivery.Headers(m.Headers),
			ContentType: m.ContentType, Body: m.Body,
			Assignment: p.st.Gate().Epoch, // every inflight lease is under the current assignment
		})
		n++
	}
	p.logger.Info("recovered leases adopted", "owner", c.Owner(), "adopted", n)
	return n
}

// deliver hands durable leases to their consumers, reading each payload
// from the cache or the log.
func (p *Partition) deliver(ds []pending) {
	p.readAhead(ds)
	defer clear(p.loaded)
	for _, d := range ds {
		if !slices.Contains(p.consumers, d.c) {
			continue // detached meanwhile; its leases were released
		}
		if h, ok := p.holders[d.offset]; !ok || h.leaseID != d.leaseID {
			// The lease ended (expired, say) in a turn after the one that
			// granted it: its message is ready again, so handing it over
			// would only cost a stale settle. Its credit comes back here;
			// LeaseEnded will find nothing outstanding.
			d.c.RefundCredit(1)
			continue
		}
		m, err := p.message(d.offset)
		if err != nil {
			// The lease stands and expires; the consumer never sees it.
			p.logger.Error("cannot read leased message", "offset", d.offset, "err", err)
			d.c.RefundCredit(1)
			continue
		}
		var expires int64
		var term uint64
		if !p.single {
			if in, ok := p.st.Lookup(d.offset, p.nowMs()); ok && in.LeaseID == d.leaseID {
				expires = in.DeadlineMs
			}
			term = p.term.Load()
		}
		d.c.Deliver(Delivery{
			Offset: d.offset, LeaseID: d.leaseID, Attempt: d.attempt,
			PublishedAtMs: m.PublishedAtMs, Key: m.Key, Headers: delivery.Headers(m.Headers),
			ContentType: m.ContentType, Body: m.Body, ExpiresAtMs: expires, Epoch: term,
			Assignment: d.assignment,
		})
	}
}

// readAhead loads the payloads of ds that the body cache lacks into
// p.loaded, reading each run of nearby offsets (at most readGapMax apart)
// with one sequential ScanRange instead of one Read per message: a backlog
// drained in offset order costs a few large reads. Offsets it cannot load
// are left to message, which reads them one by one and reports errors.
func (p *Partition) readAhead(ds []pending) {
	miss := p.missing[:0]
	for _, d := range ds {
		// A relocated body is not at its offset: message reads it alone.
		if _, ok := p.cache.get(d.offset); !ok && p.st.BodyLSN(d.offset) == d.offset {
			miss = append(miss, d.offset)
		}
	}
	p.missing = miss
	if len(miss) < 2 {
		return
	}
	slices.Sort(miss)
	miss = slices.Compact(miss)
	for i := 0; i < len(miss); {
		j := i + 1
		for j < len(miss) && miss[j]-miss[j-1] <= readGapMax {
			j++
		}
		run := miss[i:j]
		i = j
		if len(run) < 2 {
			continue
		}
		k := 0
		err := p.log.ScanRange(run[0], run[len(run)-1], func(r seglog.Record) error {
			for k < len(run) && run[k] < r.LSN {
				k++
			}
			if k < len(run) && run[k] == r.LSN && queue.Kind(r.Type) == queue.KindEnqueue {
				p.loaded[r.LSN] = bytes.Clone(r.Payload)
			}
			return nil
		})
		if err != nil {
			p.logger.Warn("read-ahead of leased messages failed; reading them one by one", "from", run[0], "err", err)
		}
	}
}

// message returns the published message at offset; Key and Body alias a
// buffer nobody modifies.
func (p *Partition) message(offset uint64) (*queue.Message, error) {
	m, _, err := p.messageSized(offset)
	return m, err
}

// messageSized is message that also returns the size of the payload the
// message was decoded from. The body is read from the cache, from what
// readAhead loaded, or from the log at its current location: its Enqueue
// record, or the Relocate record that last copied it forward.
func (p *Partition) messageSized(offset uint64) (*queue.Message, int, error) {
	payload, ok := p.cache.get(offset)
	if !ok {
		payload, ok = p.loaded[offset]
	}
	if ok {
		ev, err := queue.DecodeEvent(uint8(queue.KindEnqueue), payload)
		if err != nil {
			return nil, 0, err
		}
		return ev.Msg, len(payload), nil
	}
	r, err := p.log.Read(p.st.BodyLSN(offset))
	if err != nil {
		return nil, 0, err
	}
	m, err := bodyMessage(offset, r.Type, r.LSN, r.Payload)
	return m, len(r.Payload), err
}

// Reserved headers on dead-letter copies.
const (
	HeaderSourceTopic     = "sinew.source.topic"
	HeaderSourceGroup     = "sinew.source.group"
	HeaderSourcePartition = "sinew.source.partition"
	HeaderSourceOffset    = "sinew.source.offset"
	HeaderRetries         = "sinew.retries"
	HeaderReason          = "sinew.reason"
	HeaderDeadLetteredAt  = "sinew.dead_lettered_at_ms"
	// ReservedHeaderPrefix starts every header name the broker owns.
	ReservedHeaderPrefix = "sinew."
)

// startDeadLetters starts copies for dead-lettering messages that are due,
// up to deadLetterInflightMax at a time, lowest offset first.
func (p *Partition) startDeadLetters(now int64) {
	if len(p.deadLetters) == 0 || p.dlInflight >= deadLetterInflightMax {
		return
	}
	due := make([]uint64, 0, min(len(p.deadLetters), deadLetterInflightMax))
	for off, d := range p.deadLetters {
		if !d.inflight && d.retryAtMs <= now {
			due = append(due, off)
		}
	}
	slices.Sort(due)
	for _, off := range due {
		if p.dlInflight >= deadLetterInflightMax {
			p.more = true
			return
		}
		info, ok := p.st.Lookup(off, now)
		if !ok || info.State != queue.StateDeadLettering {
			delete(p.deadLetters, off)
			continue
		}
		d := p.deadLetters[off]
		m, err := p.message(off)
		if err != nil {
			p.logger.Error("cannot read dead-lettered message", "offset", off, "err", err)
			d.retryAtMs = now + deadLetterRetryMs
			continue
		}
		cp := p.deadLetterCopy(m, info)
		d.inflight = true
		p.dlInflight++
		if p.cfg.DeadLetter == nil {
			p.deadLettered(off, errors.New("no dead-letter publisher configured"))
			continue
		}
		p.cfg.DeadLetter(info.Target, cp, func(err error) { p.deadLettered(off, err) })
	}
}

func (p *Partition) deadLettered(off uint64, err error) {
	_ = p.control(control{kind: ctlDeadLettered, offset: off, err: err})
}

func (p *Partition) deadLetterCopy(m *queue.Message, info queue.Info) *queue.Message {
	hs := make([]queue.Header, 0, len(m.Headers)+7)
	for _, h := range m.Headers {
		if !strings.HasPrefix(h.Key, ReservedHeaderPrefix) {
			hs = append(hs, h)
		}
	}
	hs = append(hs,
		queue.Header{Key: HeaderSourceTopic, Value: p.cfg.Topic},
		queue.Header{Key: HeaderSourceGroup, Value: p.cfg.Group},
		queue.Header{Key: HeaderSourcePartition, Value: strconv.FormatUint(uint64(p.cfg.Index), 10)},
		queue.Header{Key: HeaderSourceOffset, Value: strconv.FormatUint(info.Offset, 10)},
		queue.Header{Key: HeaderRetries, Value: strconv.FormatUint(uint64(info.Attempt), 10)},
		queue.Header{Key: HeaderReason, Value: info.Reason.String()},
		queue.Header{Key: HeaderDeadLetteredAt, Value: strconv.FormatInt(info.DeadlineMs, 10)},
	)
	return &queue.Message{
		Key: m.Key, Headers: hs, ContentType: m.ContentType, Body: m.Body,
	}
}
