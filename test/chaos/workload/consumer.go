package workload

import (
	"context"
	"fmt"

	"github.com/sinewmq/sinew/protocol"
	"github.com/sinewmq/sinew/test/chaos/checker"
)

// settleBatchDefault is used when HELLO_OK announces no settle batch limit.
const settleBatchDefault = 64

// consumer subscribes with manual ack, records each delivery and acks it at
// once, recording each ack the broker confirms. After a break it offers its
// resume identity; when the session was resumed it reconciles its
// subscription and sends again the acks whose results were lost, otherwise it
// subscribes afresh.
type consumer struct {
	cfg   *Config
	name  string
	stats *Stats
	index int

	ident protocol.ResumeIdentity
	subID uint64
	// sentAcks are deliveries whose SETTLE_RESULT has not arrived, by tag;
	// tags are valid only within the session that issued them.
	sentAcks map[uint64]delivered
	// ackWritten holds the tags of sentAcks whose ACK frame was written.
	ackWritten map[uint64]bool
	// resent holds tags acked again on a resumed session because the first
	// result was lost; a refusal of those says nothing about the first ack.
	resent map[uint64]bool
}

// delivered is what a consumer remembers of a delivery until its ack result.
type delivered struct {
	id  checker.ID
	pos checker.Pos
}

func (k *consumer) run(ctx context.Context) {
	k.sentAcks = make(map[uint64]delivered)
	k.ackWritten = make(map[uint64]bool)
	k.resent = make(map[uint64]bool)
	for fails := 0; ctx.Err() == nil; {
		var resume protocol.ResumeIdentity
		if k.cfg.Resume {
			resume = k.ident
		}
		c, err := dial(ctx, k.cfg, k.cfg.Addr, k.name, resume)
		if err != nil {
			k.stats.add(func(s *Counters) { s.DialFailures++ })
			if !backoff(ctx, fails) {
				return
			}
			fails++
			continue
		}
		fails = 0
		k.ident = c.hello.Resume
		outcome := c.hello.Outcome
		k.stats.add(func(s *Counters) { s.Connects++; s.ResumeOutcomes[outcome.String()]++ })
		stop := make(chan struct{})
		go c.heartbeat(stop)
		go func() {
			select {
			case <-ctx.Done():
				c.close()
			case <-stop:
			}
		}()
		err = k.serve(c, outcome == protocol.ResumeResumed)
		close(stop)
		c.close()
		if err != nil && ctx.Err() == nil {
			k.stats.add(func(s *Counters) { s.ConnErrors++ })
			if k.cfg.Logf != nil {
				k.cfg.Logf("%s: connection ended: %v", k.name, err)
			}
			if !backoff(ctx, 1) {
				return
			}
		}
	}
}

// serve runs one connection until it fails.
func (k *consumer) serve(c *wconn, resumed bool) error {
	acks := make(map[uint64][]uint64) // request id -> tags of that ACK
	if resumed && k.subID != 0 {
		if _, err := c.send(0, &protocol.Reconcile{Policy: protocol.ReconcileRestore, Subs: []protocol.SubView{k.view()}}); err != nil {
			return err
		}
		// Acks whose results were lost with the old socket: the tags are still
		// valid in the resumed session, and ACK is idempotent.
		sent := k.takeSent()
		for _, tag := range sent {
			k.resent[tag] = true
		}
		if err := k.flush(c, acks, sent); err != nil {
			return err
		}
	} else {
		// Tags died with the old session. An ACK already written may or may
		// not have taken effect; nobody can tell us now.
		for tag := range k.ackWritten {
			if d, ok := k.sentAcks[tag]; ok {
				k.cfg.Checker.AckInDoubt(d.id)
			}
		}
		clear(k.sentAcks)
		clear(k.ackWritten)
		clear(k.resent)
		k.subID = 0
		if err := k.subscribe(c); err != nil {
			return err
		}
	}
	batchMax := int(c.hello.Limits.SettleBatchMax)
	if batchMax <= 0 {
		batchMax = settleBatchDefault
	}
	var toAck []uint64
	for {
		h, body, err := c.next()
		if err != nil {
			return err
		}
		switch m := body.(type) {
		case *protocol.Deliver:
			at := k.cfg.sinceMs()
			id, derr := checker.DecodeBody(m.Body)
			if derr != nil {
				k.cfg.Checker.Corrupt(fmt.Sprintf("partition %d offset %d attempt %d: %v", m.Partition, m.Offset, m.Attempt, derr), at)
			} else {
				pos := checker.Pos{Partition: m.Partition, Offset: m.Offset}
				k.cfg.Checker.Delivered(id, pos, at)
				k.sentAcks[m.Tag] = delivered{id, pos}
			}
			k.stats.add(func(s *Counters) { s.Deliveries++ })
			toAck = append(toAck, m.Tag)
		case *protocol.SettleResult:
			tags := acks[h.RequestID]
			delete(acks, h.RequestID)
			for i, tag := range tags {
				d, ok := k.sentAcks[tag]
				delete(k.sentAcks, tag)
				delete(k.ackWritten, tag)
				resent := k.resent[tag]
				delete(k.resent, tag)
				switch {
				case i < len(m.Codes) && m.Codes[i] == protocol.CodeOK && ok:
					k.cfg.Checker.Settled(d.id, d.pos)
				case resent && ok:
					// The first ACK may have settled it; this one cannot tell.
					k.cfg.Checker.AckInDoubt(d.id)
				case i < len(m.Codes) && inDoubtCode(m.Codes[i]) && ok:
					k.cfg.Checker.AckInDoubt(d.id)
				default:
					k.cfg.Checker.SettleRefused()
				}
			}
		case *protocol.ReconcileResult:
			kept := false
			for _, e := range m.Entries {
				if e.ClientSubID == k.subID && e.Action == protocol.ActionKeep {
					k.subID, kept = e.ServerSubID, true
				}
			}
			if !kept {
				k.subID = 0
				if err := k.subscribe(c); err != nil {
					return err
				}
			}
		case *protocol.SubscribeOK:
			k.subID = m.SubID
		case *protocol.SubClosed:
			if m.SubID == k.subID {
				k.subID = 0
				if m.Reason == protocol.SubClosedShutdown {
					continue // the broker is draining; the connection ends soon
				}
				if err := k.subscribe(c); err != nil {
					return err
				}
			}
		case *protocol.GoingAway:
			k.stats.add(func(s *Counters) { s.GoingAway++ })
		case *protocol.ErrorBody:
			if _, isAck := acks[h.RequestID]; isAck {
				// The whole ACK failed: its tags stay unsettled and may come
				// back, unless the refusal leaves the outcome open.
				for _, tag := range acks[h.RequestID] {
					if d, ok := k.sentAcks[tag]; ok && inDoubtCode(m.Code) {
						k.cfg.Checker.AckInDoubt(d.id)
					} else {
						k.cfg.Checker.SettleRefused()
					}
					delete(k.sentAcks, tag)
					delete(k.ackWritten, tag)
				}
				delete(acks, h.RequestID)
			}
			if m.Fatal {
				return m.Err()
			}
			if h.RequestID != 0 && k.subID == 0 {
				// Most likely our SUBSCRIBE failed (the broker is recovering):
				// reconnect after a back-off rather than hammer it.
				return fmt.Errorf("workload: subscribe refused: %w", m.Err())
			}
		}
		// Batch acks: flush when the reader has nothing buffered or the batch is full.
		if len(toAck) > 0 && (c.br.Buffered() == 0 || len(toAck) >= batchMax) {
			for len(toAck) > 0 {
				n := min(len(toAck), batchMax)
				if err := k.flush(c, acks, toAck[:n]); err != nil {
					return err
				}
				toAck = toAck[n:]
			}
		}
	}
}

// inDoubtCode reports whether an ACK refused with code may still have taken
// effect. A partition that failed (a write or fsync error) refuses with
// unavailable every settle whose record it cannot prove durable, but the
// record may have reached the disk all the same and count after a restart;
// so may one refused because the broker was shutting down mid-settle.
func inDoubtCode(code protocol.Code) bool {
	return code == protocol.CodeUnavailable || code == protocol.CodeShuttingDown
}

func (k *consumer) view() protocol.SubView {
	return protocol.SubView{SubID: k.subID, Topic: k.cfg.Topic, Partition: -1,
		AckMode: protocol.AckManual, Prefetch: k.cfg.Prefetch}
}

func (k *consumer) subscribe(c *wconn) error {
	_, err := c.send(0, &protocol.Subscribe{Topic: k.cfg.Topic, Partition: -1,
		AckMode: protocol.AckManual, Prefetch: k.cfg.Prefetch})
	return err
}

// takeSent returns the tags of acks whose results are unknown, oldest first.
func (k *consumer) takeSent() []uint64 {
	tags := make([]uint64, 0, len(k.sentAcks))
	for tag := range k.sentAcks {
		tags = append(tags, tag)
	}
	return tags
}

func (k *consumer) flush(c *wconn, acks map[uint64][]uint64, tags []uint64) error {
	if len(tags) == 0 {
		return nil
	}
	batchMax := int(c.hello.Limits.SettleBatchMax)
	if batchMax <= 0 {
		batchMax = settleBatchDefault
	}
	for len(tags) > 0 {
		n := min(len(tags), batchMax)
		batch := append([]uint64(nil), tags[:n]...)
		req, err := c.send(0, &protocol.Settle{Kind: protocol.OpAck, Tags: batch})
		if err != nil {
			return err
		}
		acks[req] = batch
		for _, tag := range batch {
			k.ackWritten[tag] = true
		}
		k.stats.add(func(s *Counters) { s.Acks += len(batch) })
		tags = tags[n:]
	}
	return nil
}
