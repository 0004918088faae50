package sinew

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// Hedged publishes (cluster mode: a client with WithSeeds, or one that
// learned its node is clustered).
//
// When a partition's owner is cut off from the client without a reset, its
// connection goes silent: nothing says the publish failed until the client
// gives the connection up, three heartbeat intervals later (3 s with
// seeds). Meanwhile the cluster elects a new owner in about a second. So a
// publish not confirmed within publishHedgeAfter (500 ms) of its first send
// is sent once more (the hedge), to the partition's owner as METADATA names
// it now, and the first confirm is the publish's outcome. The hedge's timer
// is set once per publish: the resends that follow a quick refusal
// (unavailable, fenced: see router.retry) do not restart it, and the hedge
// is measured against the node of the latest send:
//
//	send to owner A ──────────── (silence) ──────────── A given up (3 s)
//	     │ 500 ms
//	     └─ hedge: METADATA (asked of the other nodes first; again every
//	        hedgeLookEvery while it names A or no owner, and A stopped
//	        answering) ── owner B ── send to B ── confirm: the outcome
//
// Only publishes the broker deduplicates are hedged: those with a producer
// id (the default; see Client.PublishAsync). The hedge carries the same
// producer id, sequence, key and partition choice, so it lands in the same
// partition (the broker places a keyless one by its identity), where the
// partition's replicated dedup window recognises it: a copy the old owner
// committed to a quorum before the cut is in the new owner's log, and the
// hedge is answered Duplicate with its offset; a copy the old owner never
// committed is discarded when it rejoins, and the hedge is the one stored.
// A publish without a producer id could be stored twice, so it is never
// hedged.
//
// A node that refused the partition within shunAfterRefusal is never the
// hedge's target: while METADATA still names it, the hedge looks again.
// The hedge is skipped when METADATA still names the same owner and its
// connection read something (a confirm, a pong) within publishHedgeAfter:
// a slow but live owner gets no second copy (the same connection would
// carry it anyway). One that read nothing for that long is sent a PING: a
// live node answers it at once, and the hedge is skipped; a silent one gets
// hedgeLookEvery to answer, and the next look follows. At most
// one hedge per publish, at most publishHedgesMax in flight per client, and
// only where the new owner's publish window has room; the other publishes
// wait for their connection as before. A hedge refused by the node it was
// sent to (unavailable while its election is not over, not_owner, fenced,
// shutting_down, or no connection: hedgeRefused) stored nothing there; that
// node is passed over and the hedge looks again, within its looks. A
// publish is reported confirmed only once a broker confirmed it: a failed
// hedge is dropped while the original path goes on, and when the original
// path fails first its error is kept until the hedge has answered. A hedge
// claims its send (claimHedgeSend): until it has, a publish refused at a
// stale partition hint may still go again without it (flight.unhint).

// Bounds of hedged publishes.
const (
	// publishHedgeAfter is how long a publish waits for its owner's
	// confirm before it is hedged: longer than a confirm takes (one
	// replication round), no longer than the cluster's election timeout
	// (500 ms to 1 s), so that the hedge's first look comes as the new
	// owner is elected, not a look period after. A hedge of a slow but
	// live owner sends nothing (see above), so hedging early costs a
	// shared METADATA lookup.
	publishHedgeAfter = 500 * time.Millisecond
	// publishHedgesMax bounds the hedges in flight per client.
	publishHedgesMax = 256
	// hedgeLookEvery is how often a hedge asks METADATA again while it
	// names no new owner; lookups of one queue within it share an answer.
	hedgeLookEvery = 100 * time.Millisecond
	// hedgeLooksMax bounds the lookups of one hedge (about 5 s with the
	// pause above, past the time the connection is given up).
	hedgeLooksMax = 50
	// hedgeHopsMax bounds the sends of one hedge (a not_owner answer is
	// followed, never back to the silent node).
	hedgeHopsMax = 2
	// hedgeOrderWaitsMax bounds the out_of_sequence refusals one hedge
	// waits out (order.go) before it is dropped.
	hedgeOrderWaitsMax = 16
	// hedgeCacheMax bounds the queues whose METADATA answer is cached.
	hedgeCacheMax = 256
)

// Outcomes of one hedge, for the log and the tests (router.onHedge).
const (
	hedgeWon     = "won"     // the hedge was confirmed first
	hedgeLost    = "lost"    // sent, but the original path answered first, or the hedge failed
	hedgeSkipped = "skipped" // METADATA names the same, live owner
	hedgeNoOwner = "noowner" // no other owner found within hedgeLooksMax lookups
	hedgeFull    = "full"    // no hedge slot, or no room in the new owner's window
)

// errHedgeNotSent marks a hedge that sent nothing.
var errHedgeNotSent = errors.New("sinew: publish not hedged")

// flight is one publish's progress across its sends: the original path
// (router.send and resend) and at most one hedge. The first confirm
// resolves the future; an error resolves it only once neither path can
// still confirm.
type flight struct {
	f  *PublishFuture
	mu sync.Mutex
	// done is set once f is resolved (f.done then closes).
	done bool
	// hedged: a hedge was started for this publish (at most one);
	// hedging: it has not answered yet; hedgeSent: it sent the publish
	// (a hedge that only looked stored nothing); noHedgeSend: a hedge
	// still looking must not send (the publish went unhinted).
	hedged, hedging, hedgeSent, noHedgeSend bool
	// failed is the original path's final error, kept while the hedge
	// runs.
	failed error
	// start is the first send (clock unix ns); cur is the endpoint of
	// the latest send, the one the hedge is measured against.
	start int64
	cur   *endpoint
	// armed: the hedge's timer was set (once per publish); disarm stops
	// it, once the publish is resolved.
	armed  bool
	disarm func()
	// ordered: the publish is numbered by the Client and linked to its
	// lane's unresolved publishes on every send (order.go).
	ordered bool
	lane    laneKey
	// hinted: the publish's partition came from a broker's hint, not the
	// application (hint.go); cleared when a not_found sends it unhinted.
	hinted atomic.Bool
	// uncertain is set once a send of the publish broke off before its
	// answer (rerouted): that send may have stored it.
	uncertain atomic.Bool
	// outOfOrder counts its out_of_sequence refusals (order.go).
	outOfOrder atomic.Int32
}

// unhint reports whether the publish, refused with not_found at its
// hinted partition, may go again without a partition: only while no
// hedge has sent it and no earlier send may have stored it (a send whose
// outcome is unknown could have reached a node with a newer catalogue).
// It then also bars any later hedge, and any send of a hedge still
// looking for the owner, since both would carry the hinted partition. A
// hedge that looked and sent nothing (the owner was slow but live, as
// while it creates the queue) does not keep the publish on its stale hint.
func (fl *flight) unhint() bool {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.hedgeSent || fl.uncertain.Load() || !fl.hinted.CompareAndSwap(true, false) {
		return false
	}
	fl.hedged, fl.noHedgeSend = true, true
	return true
}

// claimHedgeSend reports whether the hedge may send the publish now, and
// records that it does (unhint then leaves the hint alone).
func (fl *flight) claimHedgeSend() bool {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.done || fl.noHedgeSend {
		return false
	}
	fl.hedgeSent = true
	return true
}

// sending records a send of the publish on e at now.
func (fl *flight) sending(e *endpoint, now int64) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.start == 0 {
		fl.start = now
	}
	fl.cur = e
}

// startedAt returns the first send's time (clock unix ns).
func (fl *flight) startedAt() int64 {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.start
}

// endpoint returns the endpoint of the latest send.
func (fl *flight) endpoint() *endpoint {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.cur
}

// arm reports whether the hedge's timer is to be set now (the first time
// a send may be hedged), and marks it set.
func (fl *flight) arm() bool {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.armed || fl.done {
		return false
	}
	fl.armed = true
	return true
}

// setDisarm keeps stop, the hedge timer's, for when the publish is
// resolved; it stops it at once if that happened already.
func (fl *flight) setDisarm(stop func()) {
	fl.mu.Lock()
	if !fl.done {
		fl.disarm = stop
		fl.mu.Unlock()
		return
	}
	fl.mu.Unlock()
	stop()
}

// doneLocked marks fl resolved and returns the hedge timer's stop (or a
// no-op). fl.mu is held.
func (fl *flight) doneLocked() func() {
	fl.done = true
	stop := fl.disarm
	fl.disarm = nil
	if stop == nil {
		return func() {}
	}
	return stop
}

// resolved reports whether the publish has its outcome.
func (fl *flight) resolved() bool {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.done
}

// finish takes the original path's outcome: a confirm wins; an error waits
// for a hedge still in flight.
func (fl *flight) finish(b protocol.Body, err error) {
	fl.mu.Lock()
	if fl.done {
		fl.mu.Unlock()
		return
	}
	if err != nil && fl.hedging {
		fl.failed = err
		fl.mu.Unlock()
		return
	}
	stop := fl.doneLocked()
	fl.mu.Unlock()
	stop()
	fl.f.resolve(b, err)
}

// startHedge reports whether a hedge may start now, and marks it started.
func (fl *flight) startHedge() bool {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.done || fl.hedged {
		return false
	}
	fl.hedged, fl.hedging = true, true
	return true
}

// hedgeEnd takes the hedge's outcome: a confirm wins; a failure is dropped,
// unless the original path already failed, whose error then resolves it.
// The publish is resolved by the returned func (nil when there is nothing
// to resolve), which the caller runs once it has logged the outcome, so a
// publish that returns has its hedge already logged.
func (fl *flight) hedgeEnd(b protocol.Body, err error) (won bool, resolve func()) {
	fl.mu.Lock()
	fl.hedging = false
	if fl.done {
		fl.mu.Unlock()
		return false, nil
	}
	if err == nil {
		stop := fl.doneLocked()
		fl.mu.Unlock()
		stop()
		return true, func() { fl.f.resolve(b, nil) }
	}
	failed := fl.failed
	stop := func() {}
	if failed != nil {
		stop = fl.doneLocked()
	}
	fl.mu.Unlock()
	stop()
	if failed != nil {
		return false, func() { fl.f.resolve(nil, failed) }
	}
	return false, nil
}

// hedgeable reports whether a send of p may be hedged: in cluster mode (a
// client with seeds, or one that learned its node is clustered), a
// deduplicated publish not hedged before.
func (r *router) hedgeable(p *protocol.Publish, fl *flight) bool {
	if !r.clustered.Load() || p.ProducerID == "" {
		return false
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return !fl.hedged && !fl.done
}

// hedge sends p, unconfirmed on from, to the partition's current owner
// (see the comment at the top of this file). It runs on its own goroutine.
func (r *router) hedge(ctx context.Context, from *endpoint, p *protocol.Publish, fl *flight, size int) {
	select {
	case r.hedges <- struct{}{}:
	default:
		r.hedged(p, from.addr, "", hedgeFull)
		return
	}
	defer func() { <-r.hedges }()
	if !fl.startHedge() {
		return
	}
	outcome, owner := hedgeNoOwner, ""
	var b protocol.Body
	err := errHedgeNotSent
	paused := false // a PING's wait was the pause
look:
	for i := range hedgeLooksMax {
		if i > 0 && !paused {
			select {
			case <-r.c.o.clock.After(hedgeLookEvery):
			case <-fl.f.done:
				break look
			case <-ctx.Done():
				break look
			}
		}
		if fl.resolved() || ctx.Err() != nil {
			break
		}
		paused = false
		owner = r.hedgeOwner(ctx, p, from.addr)
		switch {
		case owner == "":
			continue // an election under way
		case r.isShunned(p, owner):
			// It refused the partition just now (unavailable, fenced):
			// the answer is older than its refusal; ask again.
			continue
		case owner == from.addr:
			// Silent for a while: a live node answers a PING at once; a
			// cut off one does not, and the cluster replaces it.
			if from.answeredRecently() || from.answersPing(ctx, hedgeLookEvery, fl.f.done) {
				outcome = hedgeSkipped // slow but live: no second copy
				break look
			}
			paused = true
			continue
		}
		outcome, b, err = r.hedgeSend(ctx, from.addr, owner, p, fl, size)
		if (outcome == hedgeLost || outcome == hedgeNoOwner) && i+1 < hedgeLooksMax && hedgeRefused(err) {
			// The node METADATA named refused the partition (an election
			// not over yet, a node cut off, a stale answer) and stored
			// nothing: it is passed over, and the hedge looks again
			// rather than leaving the publish to its silent connection.
			r.shunNode(p, owner)
			outcome, owner, b, err = hedgeNoOwner, "", nil, errHedgeNotSent
			continue
		}
		break
	}
	won, resolve := fl.hedgeEnd(b, err)
	if won {
		outcome = hedgeWon
	}
	r.hedged(p, from.addr, owner, outcome)
	if resolve != nil {
		resolve()
	}
}

// hedgeRefused reports whether a hedge's send was refused by a node that
// does not own the partition (yet), or could not be made: the hedge may
// look for the owner again.
func hedgeRefused(err error) bool {
	var be *BrokerError
	if errors.As(err, &be) {
		switch be.Code {
		case protocol.CodeUnavailable, protocol.CodeFenced, protocol.CodeNotOwner, protocol.CodeShuttingDown:
			return true
		}
		return false
	}
	return errors.Is(err, ErrNotConnected)
}

// hedged logs a hedge's outcome and tells the test hook.
func (r *router) hedged(p *protocol.Publish, from, to, outcome string) {
	r.c.o.logger.Debug("sinew: publish hedged", "topic", p.Topic, "from", from, "to", to, "outcome", outcome)
	if h := r.onHedge; h != nil {
		h(outcome)
	}
}

// hedgeSend sends p to owner, following one not_owner (never back to
// silent), and waits for the answer or for the publish to be resolved
// otherwise.
func (r *router) hedgeSend(ctx context.Context, silent, owner string, p *protocol.Publish, fl *flight, size int) (string, protocol.Body, error) {
	waits := 0
	for hop := 0; ; hop++ {
		e := r.c.pool.get(owner)
		if !r.reachable(ctx, e) {
			return hedgeNoOwner, nil, fmt.Errorf("%w: %s", ErrNotConnected, owner)
		}
		if !e.window.tryAcquire(size) {
			return hedgeFull, nil, errHedgeNotSent
		}
		if !fl.claimHedgeSend() {
			// Resolved, or sent again without its stale partition hint
			// (unhint) while the hedge looked: nothing to send.
			e.window.release(size)
			return hedgeLost, nil, errHedgeNotSent
		}
		type answer struct {
			b   protocol.Body
			err error
		}
		res := make(chan answer, 1)
		// Not replayed: a hedge whose connection breaks is dropped, and
		// the original path goes on.
		cl := &call{body: r.c.stamped(p, fl), done: func(b protocol.Body, err error) {
			e.window.release(size)
			res <- answer{b, err}
		}}
		e.submitNow(ctx, cl)
		var a answer
		select {
		case a = <-res:
		case <-fl.f.done:
			return hedgeLost, nil, errHedgeNotSent
		case <-ctx.Done():
			return hedgeLost, nil, ctx.Err()
		}
		if a.err == nil {
			// It confirmed, so it owns the partition: later publishes go
			// there first (set before the outcome is reported).
			r.mu.Lock()
			r.setOwnerLocked(keyOf(p), owner)
			r.mu.Unlock()
			return hedgeWon, a.b, nil
		}
		var be *BrokerError
		if errors.As(a.err, &be) && be.Code == protocol.CodeNotOwner && be.Owner != "" &&
			be.Owner != silent && be.Owner != owner && hop+1 < hedgeHopsMax {
			r.learn(be.Owner)
			owner = be.Owner
			continue
		}
		if errors.As(a.err, &be) && be.Code == protocol.CodeOutOfSequence && waits < hedgeOrderWaitsMax {
			// The owner answers; the publish this one follows is not
			// there yet (order.go): once it resolves, the same owner
			// again, with a new link.
			waits++
			hop--
			if !r.c.waitPrev(ctx, p, fl) {
				return hedgeLost, nil, errHedgeNotSent
			}
			continue
		}
		return hedgeLost, nil, a.err
	}
}

// answeredRecently reports whether e's connection is up and read something
// (a confirm, a pong) within publishHedgeAfter: its node is alive.
func (e *endpoint) answeredRecently() bool {
	c := e.live.Load()
	if c == nil || c.isClosed() {
		return false
	}
	return e.o.clock.Now().UnixNano()-c.lastRead.Load() < int64(publishHedgeAfter)
}

// answersPing sends a PING on e's connection and reports whether its PONG
// came within d on the client's clock. It stops waiting when done closes.
func (e *endpoint) answersPing(ctx context.Context, d time.Duration, done <-chan struct{}) bool {
	c := e.live.Load()
	if c == nil || c.isClosed() {
		return false
	}
	res := make(chan error, 1)
	cl := &call{body: &protocol.Ping{}, done: func(_ protocol.Body, err error) { res <- err }}
	if err := c.start(ctx, cl); err != nil {
		return false
	}
	select {
	case err := <-res:
		return err == nil
	case <-e.o.clock.After(d):
	case <-done:
	case <-ctx.Done():
	}
	c.take(cl.id)
	return false
}

// hedgeOwner returns the owner METADATA names for the partition p goes
// to, or "" when there is none or no node answered. avoid (the silent
// node) is asked last.
func (r *router) hedgeOwner(ctx context.Context, p *protocol.Publish, avoid string) string {
	md := r.hedgeMetadata(ctx, p.Topic, p.Group, avoid)
	if md == nil || len(md.Partitions) == 0 {
		return ""
	}
	part := partitionOf(p, len(md.Partitions))
	for _, pm := range md.Partitions {
		if pm.Partition == part {
			return pm.Owner
		}
	}
	return ""
}

type queueName struct{ topic, group string }

type cachedMetadata struct {
	md *protocol.MetadataResult
	at int64 // clock unix ns
}

// hedgeMetadata asks METADATA for a queue, at most once per hedgeLookEvery:
// the hedges of one failover share the answer. Lookups are serialised.
func (r *router) hedgeMetadata(ctx context.Context, topic, group, avoid string) *protocol.MetadataResult {
	r.hedgeMu.Lock()
	defer r.hedgeMu.Unlock()
	k := queueName{topic, group}
	now := r.c.o.clock.Now().UnixNano()
	if c, ok := r.hedgeCache[k]; ok && now-c.at < int64(hedgeLookEvery) {
		return c.md
	}
	md, err := r.c.metadata(ctx, topic, group, avoid)
	if err != nil {
		return nil
	}
	if len(r.hedgeCache) >= hedgeCacheMax {
		clear(r.hedgeCache)
	}
	r.hedgeCache[k] = cachedMetadata{md, r.c.o.clock.Now().UnixNano()}
	return md
}

// partitionOf returns the partition of n the broker places p in, as
// internal/broker's queueEntry.pick does: the named one, the key's FNV-1a
// hash, or, keyless with a producer id, the FNV-1a hash of the id and the
// sequence (8 bytes, little endian). Both hashes are part of the broker's
// on-disk contract, so they do not change. A keyless publish without a
// producer id (round-robin) is never hedged; it gets partition 0.
func partitionOf(p *protocol.Publish, n int) uint32 {
	switch {
	case n <= 0:
		return 0
	case p.Partition >= 0:
		return uint32(p.Partition)
	case len(p.Key) > 0:
		h := fnv.New32a()
		h.Write(p.Key)
		return h.Sum32() % uint32(n)
	case p.ProducerID != "":
		h := fnv.New32a()
		h.Write([]byte(p.ProducerID))
		h.Write(binary.LittleEndian.AppendUint64(nil, p.ProducerSeq))
		return h.Sum32() % uint32(n)
	}
	return 0
}
