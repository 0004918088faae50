package sinew

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// Ordered publish.
//
// The Client numbers its confirmed publishes with one counter (seq), so a
// partition sees a producer's sequences increasing but with gaps. Order is
// therefore kept by a link: every send of a publish names in producer_prev
// the highest sequence below its own that is still unconfirmed in the same
// lane and was sent already, and the partition stores it only once it holds
// that sequence, answering out_of_sequence otherwise (docs/protocol.md,
// Ordered publish).
//
// Only publishes sent already are linked to: marked sent once their first
// frame is queued on a connection (router.send). A publish numbered before
// another but not yet queued was published concurrently with it
// (PublishAsync had not returned), and the two are ordered as they reach
// the connection. Linking to it would make the broker refuse the other
// until it arrived, which costs a refusal and a resend per publish when many
// goroutines share a Client, and orders nothing the application could have
// observed. A publish made after another's PublishAsync returned always
// finds that one sent, its frame queued ahead on the same connection when
// both go to the same node, so in the steady state nothing is refused.
//
// A lane is what fixes a publish's partition: its queue and explicit
// partition (WithPartition), else its queue and key (WithKey), else its
// queue alone (keyless: the broker checks the link only when both land in
// the same partition, so on a queue of one partition all are ordered).
//
// The link is computed again for every send (the first, a resend after a
// redirect, a cut, a refusal or a failover, and the hedge), from the
// publishes unresolved at that moment. A publish leaves its lane when its
// future resolves, before the future's done channel closes, so a follower
// woken by it never links to it again. Hence no refusal lasts: a link
// points only at a publish that will be confirmed (and is then held) or
// fail (and is then dropped). A lane holds only unresolved publishes, so
// the lanes together are bounded by the publishes in flight.
//
// A publish refused with out_of_sequence waits for the publish it linked
// to (at most orderWaitMax) and is sent again through the router, with a
// fresh link. Publishes numbered by the application (WithProducerSequence)
// are not linked.

// orderWaitMax bounds how long a publish refused with out_of_sequence
// waits for the publish it followed before it is sent again.
const orderWaitMax = 200 * time.Millisecond

// laneKey names a lane: see above.
type laneKey struct {
	topic, group string
	partition    int32 // -1: chosen by the broker
	key          string
}

func laneOf(p *protocol.Publish) laneKey {
	k := laneKey{topic: p.Topic, group: p.Group, partition: max(p.Partition, -1)}
	if k.partition < 0 {
		k.key = string(p.Key)
	}
	return k
}

// laneEntry is one unresolved publish of a lane; sent once its first frame
// was queued on a connection.
type laneEntry struct {
	seq  uint64
	done <-chan struct{}
	sent bool
	// again is set while the publish waits to be sent again after an
	// answer that stored nothing (a refusal, a redirect, a cut), and
	// closed when it is queued again: a follower refused because it
	// arrived first waits for that, not for the publish's confirm.
	again chan struct{}
}

// lanes holds, per lane, the Client's unresolved publishes in ascending
// sequence order.
type lanes struct {
	mu sync.Mutex
	m  map[laneKey][]laneEntry
}

// number gives p the Client's next sequence and enters it in its lane, both
// under one lock so that a lane's entries are in sequence order; fl learns
// its lane, and f leaves it when it resolves.
func (l *lanes) number(c *Client, p *protocol.Publish, fl *flight) {
	k := laneOf(p)
	l.mu.Lock()
	defer l.mu.Unlock()
	p.ProducerSeq = c.seq.Add(1)
	if l.m == nil {
		l.m = make(map[laneKey][]laneEntry)
	}
	l.m[k] = append(l.m[k], laneEntry{seq: p.ProducerSeq, done: fl.f.done})
	fl.lane, fl.ordered = k, true
	seq := p.ProducerSeq
	fl.f.leave = func() { l.leave(k, seq) }
}

// leave drops seq from lane k.
func (l *lanes) leave(k laneKey, seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	es := l.m[k]
	i, ok := slices.BinarySearchFunc(es, seq, func(e laneEntry, s uint64) int {
		switch {
		case e.seq < s:
			return -1
		case e.seq > s:
			return 1
		}
		return 0
	})
	if !ok {
		return
	}
	es = slices.Delete(es, i, i+1)
	if len(es) == 0 {
		delete(l.m, k)
		return
	}
	l.m[k] = es
}

// prev returns the link for a send of seq in lane k: the highest sequence
// below it that is unresolved and was sent (0: none), and a channel closed
// when that one resolves.
func (l *lanes) prev(k laneKey, seq uint64) (uint64, <-chan struct{}) {
	s, done, _ := l.prevAgain(k, seq)
	return s, done
}

// prevAgain is prev, with the channel that closes when that publish is
// queued again (nil when it is not waiting to be sent again).
func (l *lanes) prevAgain(k laneKey, seq uint64) (uint64, <-chan struct{}, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	es := l.m[k]
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].seq < seq && es[i].sent {
			var again <-chan struct{}
			if es[i].again != nil {
				again = es[i].again
			}
			return es[i].seq, es[i].done, again
		}
	}
	return 0, nil, nil
}

// sent marks fl's publish sent: its frame was queued on a connection (or
// its submit failed, and a resend follows).
func (l *lanes) sent(fl *flight, seq uint64) {
	if !fl.ordered {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.entryLocked(fl.lane, seq); e != nil {
		e.sent = true
		if e.again != nil {
			close(e.again)
			e.again = nil
		}
	}
}

// entryLocked is the entry of sequence seq in lane k, nil when it left.
// l.mu held.
func (l *lanes) entryLocked(k laneKey, seq uint64) *laneEntry {
	es := l.m[k]
	for i := len(es) - 1; i >= 0 && es[i].seq >= seq; i-- {
		if es[i].seq == seq {
			return &es[i]
		}
	}
	return nil
}

// unsent records that the publish fl (sequence seq) will be sent again:
// its last send stored nothing, or may not reach the broker. Called where
// the answer arrives, before the resend starts, so that a follower whose
// refusal comes next on the same connection finds it waiting.
func (l *lanes) unsent(fl *flight, seq uint64) {
	if !fl.ordered {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.entryLocked(fl.lane, seq); e != nil && e.again == nil {
		e.again = make(chan struct{})
	}
}

// size returns how many publishes the lanes hold (tests).
func (l *lanes) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, es := range l.m {
		n += len(es)
	}
	return n
}

// stamped returns the publish to send for fl now: p itself when it is not
// linked, else a copy carrying its current link. A copy, because p is
// shared by the sends of one publish (a hedge may encode it meanwhile).
func (c *Client) stamped(p *protocol.Publish, fl *flight) *protocol.Publish {
	if !fl.ordered {
		return p
	}
	prev, _ := c.lanes.prev(fl.lane, p.ProducerSeq)
	q := *p
	q.ProducerPrev = prev
	return &q
}

// waitPrev waits, after an out_of_sequence refusal, until the publish fl
// now follows resolves, at most orderWaitMax. It reports false when fl was
// resolved meanwhile or ctx ended (fl is then finished with ctx's error).
func (c *Client) waitPrev(ctx context.Context, p *protocol.Publish, fl *flight) bool {
	var done, again <-chan struct{}
	if fl.ordered {
		_, done, again = c.lanes.prevAgain(fl.lane, p.ProducerSeq)
	}
	if done == nil {
		return !fl.resolved()
	}
	if fl.outOfOrder.Add(1) == 1 {
		// The first refusal: the publish it follows was refused too (or
		// redirected, or cut off) and waits to be sent again, or is
		// queued already. Sent again right after it, on the same
		// connection, this one arrives in order: a burst of followers
		// of one refused publish costs one round each, not one confirm
		// each in a row.
		if again == nil {
			return !fl.resolved()
		}
		select {
		case <-again:
			return !fl.resolved()
		case <-done:
			return !fl.resolved()
		case <-c.o.clock.After(orderWaitMax):
			return !fl.resolved()
		case <-fl.f.done:
			return false
		case <-ctx.Done():
			fl.finish(nil, ctx.Err())
			return false
		}
	}
	// Refused again: wait for the publish it follows to be resolved.
	select {
	case <-done:
	case <-c.o.clock.After(orderWaitMax):
	case <-fl.f.done:
		return false
	case <-ctx.Done():
		fl.finish(nil, ctx.Err())
		return false
	}
	return true
}
