package sinew

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// In a cluster each partition of a queue is served by its owner, one of the
// nodes holding a replica; the owner changes when a node fails. A spanning
// subscription holds one subscription on every replica node (a "part"):
// only the owner delivers, and a replica that becomes the owner starts
// delivering to the subscription it already holds. The parts deliver into
// the spanning subscription's one channel.
//
// A settle goes to the node that delivered the message. When that node is
// gone, or answers fenced (it no longer owns the partition), the settle is
// sent again to the partition's current owner, by its lease reference
// (partition, offset, lease id, epoch) on the part subscription held there:
// the new owner has the lease in its replicated state, so the settle applies
// exactly as it would have at the old owner. The application sees only the
// outcome.

// Bounds of a spanning subscription.
const (
	// spanRefreshEvery is how often the replica set is read again, so
	// that a replica moved to a new node gets a part there.
	spanRefreshEvery = 2 * time.Second
	// spanPartsMax bounds the nodes one spanning subscription subscribes on.
	spanPartsMax = 64
	// resettleHopsMax bounds the sends of one settle after its node was
	// lost; with the backoff below it gives up after about 30 s, past the
	// default lease, by which time the message is delivered again anyway.
	resettleHopsMax    = 64
	resettleBackoffMin = 20 * time.Millisecond
	resettleBackoffMax = 500 * time.Millisecond
	// settleHedgeAfter is how long a settle waits for its node's answer
	// before it is also sent to the partition's owner: longer than a
	// settle takes (a replication round), shorter than a failover plus
	// the time to notice a silent connection (three heartbeats).
	settleHedgeAfter = time.Second
	// metadataAskTimeout bounds one node's answer to METADATA before the
	// next node is asked (a node cut off answers nothing).
	metadataAskTimeout = time.Second
)

// owned is what the client knows of a partition's owner.
type owned struct {
	addr  string
	epoch uint64
}

// span is the state of a spanning subscription.
type span struct {
	c     *Client
	s     *Subscription // the spanning subscription
	group string
	poke  chan struct{} // a part ended: look again now
	stop  chan struct{} // closed when the spanning subscription ends
	once  sync.Once
	// ran is closed when run has returned (the channel is closed).
	ran chan struct{}
	// openMu serialises open, so that one node never gets two parts;
	// lookMu serialises resettle's owner lookups, so that the settles of
	// one failover share a METADATA request.
	openMu, lookMu sync.Mutex
	// pumps counts the parts whose delivery pump may still run: finish
	// closes the channel only once it is zero.
	pumps sync.WaitGroup

	mu     sync.Mutex
	parts  map[string]*Subscription // by node address
	owners map[uint32]owned
}

// subscribeSpan subscribes on every node holding a replica of topic. ok is
// false when the node does not answer METADATA (a broker that predates it):
// the caller then subscribes on its own node only.
func (c *Client) subscribeSpan(ctx context.Context, topic string, cfg subscribeConfig) (s *Subscription, err error, ok bool) {
	md, err := c.metadataRetrying(ctx, topic, cfg.group)
	var be *BrokerError
	switch {
	case errors.As(err, &be) && be.Code == protocol.CodeUnknownOp:
		return nil, nil, false
	case errors.As(err, &be) && be.Code == protocol.CodeNotFound:
		// A first SUBSCRIBE creates the queue (as on a single node); then
		// its replicas are known.
		first, err := c.subscribeAt(ctx, c.ep, topic, cfg, nil)
		if err != nil {
			return nil, err, true
		}
		uctx, cancel := context.WithTimeout(context.Background(), c.o.drainTimeout)
		_ = first.Unsubscribe(uctx)
		cancel()
		if md, err = c.metadataRetrying(ctx, topic, cfg.group); err != nil {
			return nil, err, true
		}
	case err != nil:
		return nil, err, true
	}
	if !md.Cluster {
		return nil, nil, false
	}
	s = &Subscription{e: c.ep, topic: topic, cfg: cfg, out: make(chan *Message), done: make(chan struct{}),
		pumpDone: make(chan struct{}), assigns: make(chan Assignment, assignmentBufferMax)}
	sp := &span{c: c, s: s, group: cfg.group, poke: make(chan struct{}, 1), stop: make(chan struct{}),
		ran: make(chan struct{}), parts: map[string]*Subscription{}, owners: map[uint32]owned{}}
	s.span = sp
	sp.learn(md)
	var firstErr error
	for _, addr := range sp.replicas(md) {
		if _, err := sp.open(ctx, addr); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	sp.mu.Lock()
	n := len(sp.parts)
	sp.mu.Unlock()
	if n == 0 {
		if firstErr == nil {
			firstErr = fmt.Errorf("%w: no node holding a replica of %q answered", ErrNotConnected, topic)
		}
		close(s.pumpDone)
		close(sp.ran)
		return nil, firstErr, true
	}
	if !c.addSpan(sp) {
		sp.end(ErrClientClosed)
		sp.finish()
		close(sp.ran)
		return nil, ErrClientClosed, true
	}
	go sp.run()
	return s, nil, true
}

// Bounds of Subscribe's METADATA retries (metadataRetrying).
const (
	metadataBackoffMin = 50 * time.Millisecond
	metadataBackoffMax = time.Second
	// metadataRetryMax bounds the retries when Subscribe's ctx has no
	// deadline, on the client's clock.
	metadataRetryMax = ConnectTimeoutDefault
)

// metadataRetrying is metadata, asked again with backoff (on the client's
// clock) while no node answers or the answer is retryable (an election,
// a node cut off): a cluster between two owners, or restarting, is still
// subscribed to. It gives up when ctx ends, or, when ctx has no deadline,
// after metadataRetryMax; the error then wraps the last answer. A final
// answer (a bad request, unknown_op, not_found) is returned at once.
func (c *Client) metadataRetrying(ctx context.Context, topic, group string) (*protocol.MetadataResult, error) {
	clock := c.o.clock
	_, bounded := ctx.Deadline()
	giveUp := clock.Now().Add(metadataRetryMax)
	for n := 0; ; n++ {
		md, err := c.metadata(ctx, topic, group, "")
		var be *BrokerError
		if err == nil || !IsRetryable(err) || errors.As(err, &be) && (be.Code == protocol.CodeNotFound || be.Code == protocol.CodeUnknownOp) {
			return md, err
		}
		d := min(metadataBackoffMin<<min(n, 8), metadataBackoffMax)
		if !bounded && !clock.Now().Add(d).Before(giveUp) {
			return nil, fmt.Errorf("%w: no node answered METADATA for %q within %v", err, topic, metadataRetryMax)
		}
		c.o.logger.Debug("sinew: no node answered METADATA, retrying", "topic", topic, "delay", d, "err", err)
		select {
		case <-clock.After(d):
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		}
	}
}

// metadata asks the cluster where topic's partitions are served: the
// client's node if it answers (a draining one too), else the first other
// node it knows that does; avoid (a node that just failed a request) is asked last. The
// replicas it names become known nodes.
func (c *Client) metadata(ctx context.Context, topic, group, avoid string) (*protocol.MetadataResult, error) {
	var last error
	nodes := c.rt.nodes()
	if i := slices.Index(nodes, avoid); i >= 0 {
		nodes = append(slices.Delete(nodes, i, i+1), avoid)
	}
	for _, addr := range nodes {
		e := c.pool.get(addr)
		if e.live.Load() == nil && !c.rt.reachable(ctx, e) {
			continue // a draining node still answers METADATA
		}
		actx, cancel := context.WithTimeout(ctx, metadataAskTimeout)
		md, err := e.metadata(actx, topic, group)
		cancel()
		if err == nil {
			for _, p := range md.Partitions {
				c.rt.learn(p.Replicas...)
			}
			c.rt.noteReplicas(topic, group, md)
			return md, nil
		}
		var be *BrokerError
		if errors.As(err, &be) && !be.Retryable() {
			return nil, err
		}
		last = err
	}
	if last == nil {
		last = fmt.Errorf("%w: no node of the cluster answered", ErrNotConnected)
	}
	return nil, last
}

// metadata sends METADATA on e's connection.
func (e *endpoint) metadata(ctx context.Context, topic, group string) (*protocol.MetadataResult, error) {
	conn := e.live.Load()
	if conn == nil || conn.isClosed() {
		return nil, fmt.Errorf("%w: %s", ErrNotConnected, e.addr)
	}
	reply, err := conn.roundTrip(ctx, &protocol.Metadata{Topic: topic, Group: group}, nil)
	if err != nil {
		return nil, err
	}
	md, ok := reply.(*protocol.MetadataResult)
	if !ok {
		return nil, fmt.Errorf("%w: %s in answer to METADATA", ErrProtocol, reply.Op())
	}
	return md, nil
}

// learn records md's owners and partitions.
func (sp *span) learn(md *protocol.MetadataResult) {
	sp.mu.Lock()
	parts := make([]uint32, 0, len(md.Partitions))
	for _, p := range md.Partitions {
		parts = append(parts, p.Partition)
		if p.Owner != "" && p.Epoch >= sp.owners[p.Partition].epoch {
			sp.owners[p.Partition] = owned{p.Owner, p.Epoch}
		}
	}
	sp.mu.Unlock()
	if sp.s.cfg.partition >= 0 {
		parts = []uint32{uint32(sp.s.cfg.partition)}
	}
	e := sp.s.e
	e.mu.Lock()
	sp.s.partitions = parts
	e.mu.Unlock()
}

// replicas lists the nodes holding a replica of the partitions subscribed.
func (sp *span) replicas(md *protocol.MetadataResult) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range md.Partitions {
		if sp.s.cfg.partition >= 0 && p.Partition != uint32(sp.s.cfg.partition) {
			continue
		}
		for _, r := range p.Replicas {
			if r != "" && !seen[r] && len(out) < spanPartsMax {
				seen[r] = true
				out = append(out, r)
			}
		}
	}
	return out
}

// open subscribes on the node at addr, unless a live part is there.
func (sp *span) open(ctx context.Context, addr string) (*Subscription, error) {
	sp.openMu.Lock()
	defer sp.openMu.Unlock()
	sp.mu.Lock()
	if p := sp.parts[addr]; p != nil && !p.isDone() {
		sp.mu.Unlock()
		return p, nil
	}
	select {
	case <-sp.stop:
		sp.mu.Unlock()
		return nil, ErrUnsubscribed
	default:
	}
	// Counted before the part exists: its pump starts with the
	// SUBSCRIBE's answer, and may deliver before subscribeAt returns.
	sp.pumps.Add(1)
	sp.mu.Unlock()
	e := sp.c.pool.get(addr)
	octx, cancel := context.WithTimeout(ctx, routeOpenTimeout)
	defer cancel()
	var p *Subscription
	var err error
	if sp.c.rt.reachable(octx, e) {
		p, err = sp.c.subscribeAt(octx, e, sp.s.topic, sp.s.cfg, sp.s)
	} else {
		err = fmt.Errorf("%w: %s", ErrNotConnected, addr)
	}
	if err != nil {
		sp.pumps.Done()
		return nil, err
	}
	go func() { <-p.pumpDone; sp.pumps.Done() }()
	sp.mu.Lock()
	select {
	case <-sp.stop:
		sp.mu.Unlock()
		uctx, cancel := context.WithTimeout(context.Background(), sp.c.o.drainTimeout)
		_ = p.Unsubscribe(uctx)
		cancel()
		return nil, ErrUnsubscribed
	default:
	}
	sp.parts[addr] = p
	sp.mu.Unlock()
	e.mu.Lock()
	prefetch := p.prefetch
	e.mu.Unlock()
	pe := sp.s.e
	pe.mu.Lock()
	if sp.s.prefetch == 0 {
		sp.s.prefetch = prefetch
	}
	pe.mu.Unlock()
	go func() {
		select {
		case <-p.done:
			select {
			case sp.poke <- struct{}{}:
			default:
			}
		case <-sp.stop:
		}
	}()
	return p, nil
}

// isDone reports whether the subscription ended.
func (s *Subscription) isDone() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// run keeps a part on every replica node until the spanning subscription
// ends, then closes its channel once every part has stopped delivering.
func (sp *span) run() {
	defer close(sp.ran)
	defer sp.c.removeSpan(sp)
	tick := time.NewTicker(spanRefreshEvery)
	defer tick.Stop()
	for {
		select {
		case <-sp.stop:
			sp.finish()
			return
		case <-tick.C:
		case <-sp.poke:
		}
		if err := sp.prune(); err != nil {
			sp.end(err)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*routeOpenTimeout)
		if md, err := sp.c.metadata(ctx, sp.s.topic, sp.group, ""); err == nil {
			sp.learn(md)
			replicas := sp.replicas(md)
			sp.retire(replicas)
			for _, addr := range replicas {
				if _, err := sp.open(ctx, addr); err != nil {
					sp.c.o.logger.Debug("sinew: no subscription on a replica node yet", "addr", addr, "topic", sp.s.topic, "err", err)
				}
			}
		}
		cancel()
	}
}

// prune forgets the parts that ended. A part ended by something final for
// the whole subscription (the client closed; the broker refused it for good)
// ends the spanning subscription with that error.
func (sp *span) prune() error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for addr, p := range sp.parts {
		select {
		case <-p.done:
		default:
			continue
		}
		delete(sp.parts, addr)
		err := p.Err()
		var be *BrokerError
		switch {
		case errors.Is(err, ErrClientClosed), errors.Is(err, ErrUnsubscribed):
			return err
		case errors.As(err, &be) && !be.Retryable() && be.Code != protocol.CodeNotOwner:
			return err
		}
		// Reconnects given up, reconciled away, node drained: another
		// node serves meanwhile, and the next look subscribes again.
	}
	return nil
}

// retire unsubscribes the parts on nodes that no longer hold a replica
// (the recovery plan moved it away, or the node left): they would deliver
// nothing, and would keep their nodes' connections for good.
func (sp *span) retire(replicas []string) {
	if len(replicas) == 0 {
		return
	}
	sp.mu.Lock()
	var gone []*Subscription
	for addr, p := range sp.parts {
		if !slices.Contains(replicas, addr) {
			gone = append(gone, p)
			delete(sp.parts, addr)
		}
	}
	sp.mu.Unlock()
	for _, p := range gone {
		ctx, cancel := context.WithTimeout(context.Background(), sp.c.o.drainTimeout)
		_ = p.Unsubscribe(ctx)
		cancel()
	}
}

// end ends the spanning subscription with err; run then stops its parts.
func (sp *span) end(err error) {
	e := sp.s.e
	e.mu.Lock()
	if !sp.s.ended {
		sp.s.ended = true
		sp.s.err = err
		close(sp.s.done)
	}
	e.mu.Unlock()
	sp.once.Do(func() { close(sp.stop) })
}

// finish unsubscribes every part, waits until none delivers, and closes the
// channel.
func (sp *span) finish() {
	sp.mu.Lock()
	parts := make([]*Subscription, 0, len(sp.parts))
	for _, p := range sp.parts {
		parts = append(parts, p)
	}
	sp.parts = map[string]*Subscription{}
	sp.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), sp.c.o.drainTimeout)
			_ = p.Unsubscribe(ctx)
			cancel()
		})
	}
	wg.Wait()
	// Every part's pump, pruned and retired ones included, has stopped:
	// nothing sends on the channel any more.
	sp.pumps.Wait()
	close(sp.s.out)
	close(sp.s.pumpDone)
}

// unsubscribe ends the spanning subscription and waits (bounded by ctx)
// until its parts are gone.
func (sp *span) unsubscribe(ctx context.Context) error {
	sp.end(ErrUnsubscribed)
	select {
	case <-sp.s.pumpDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// noteOwner records that addr delivered partition p under epoch.
func (sp *span) noteOwner(p uint32, addr string, epoch uint64) {
	sp.mu.Lock()
	if o := sp.owners[p]; epoch >= o.epoch && o.addr != addr {
		sp.owners[p] = owned{addr, epoch}
	}
	sp.mu.Unlock()
}

// ownerPart returns the part on p's owner as last known, or nil.
func (sp *span) ownerPart(p uint32) *Subscription {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if part := sp.parts[sp.owners[p].addr]; part != nil && !part.isDone() {
		return part
	}
	return nil
}

// lookupOwner asks METADATA for p's owner and returns the part there
// (opening one if needed), or nil. Concurrent lookups wait for each other
// and use what the first found.
func (sp *span) lookupOwner(p uint32, avoid string) *Subscription {
	sp.lookMu.Lock()
	defer sp.lookMu.Unlock()
	if part := sp.ownerPart(p); part != nil {
		return part
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*routeOpenTimeout)
	defer cancel()
	md, err := sp.c.metadata(ctx, sp.s.topic, sp.group, avoid)
	if err != nil {
		return nil
	}
	sp.learn(md)
	sp.mu.Lock()
	addr := sp.owners[p].addr
	sp.mu.Unlock()
	if addr == "" {
		return nil
	}
	part, _ := sp.open(ctx, addr)
	return part
}

// forgetOwner drops addr as p's owner.
func (sp *span) forgetOwner(p uint32, addr string) {
	sp.mu.Lock()
	if sp.owners[p].addr == addr {
		o := sp.owners[p]
		o.addr = ""
		sp.owners[p] = o
	}
	sp.mu.Unlock()
}

// resettle sends m's settle to its partition's current owner, by lease
// reference on the part held there, until an answer is final; fin gets it.
func (sp *span) resettle(m *Message, kind protocol.Op, delay int64, cause error, fin func(error)) {
	last := cause
	sp.forgetOwner(m.Partition, m.sub.e.addr)
	for hop := range resettleHopsMax {
		if hop > 0 {
			select {
			case <-sp.c.o.clock.After(min(resettleBackoffMin<<min(hop, 8), resettleBackoffMax)):
			case <-sp.stop:
				fin(fmt.Errorf("%w: the subscription ended before the settle reached the partition's owner: %w", ErrStaleDelivery, last))
				return
			}
		}
		p := sp.ownerPart(m.Partition)
		if p == nil {
			if p = sp.lookupOwner(m.Partition, m.sub.e.addr); p == nil {
				continue
			}
		}
		p.e.mu.Lock()
		id := p.serverID
		p.e.mu.Unlock()
		c := p.e.live.Load()
		if c == nil || c.isClosed() || id == 0 {
			sp.forgetOwner(m.Partition, p.e.addr)
			continue
		}
		res := make(chan error, 1)
		ref := m.lease
		ref.SubID = id
		r := &settleReq{kind: kind, delay: delay, m: m, routed: true, lease: ref, fin: func(err error) { res <- err }}
		if !c.queueSettle(r) {
			continue
		}
		var err error
		select {
		case err = <-res:
		case <-sp.c.o.clock.After(settleHedgeAfter):
			// No answer (a node cut off says nothing until its
			// connection is given up): try the owner as known now.
			// A late answer is dropped; the settle is idempotent.
			err = fmt.Errorf("%w: %s did not answer the settle within %v", ErrConnectionLost, p.e.addr, settleHedgeAfter)
		}
		if err == nil || !resettleable(err) {
			if err != nil && kind != protocol.OpAck && errors.Is(err, ErrStaleDelivery) &&
				(errors.Is(cause, ErrConnectionLost) || errors.Is(cause, ErrHeartbeatTimeout)) {
				// The first send may have taken effect before its
				// connection broke: a NACK or FAIL repeated after that
				// is stale_lease, which would misreport it. Its outcome
				// is unknown, as the first send's error said.
				fin(cause)
				return
			}
			fin(err)
			return
		}
		last = err
		sp.forgetOwner(m.Partition, p.e.addr)
	}
	fin(last)
}

// resettleable reports whether a settle that failed with err may succeed
// at the partition's owner: its node went away, no longer owns the
// partition, or the client's session there was not resumed.
func resettleable(err error) bool {
	var be *BrokerError
	if errors.As(err, &be) {
		switch be.Code {
		case protocol.CodeFenced, protocol.CodeUnavailable, protocol.CodeNotOwner, protocol.CodeShuttingDown:
			return true
		}
		return false
	}
	return errors.Is(err, ErrConnectionLost) || errors.Is(err, ErrNotConnected) || errors.Is(err, ErrDisconnected) ||
		errors.Is(err, ErrStaleDelivery) || errors.Is(err, ErrHeartbeatTimeout)
}
