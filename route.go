package sinew

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// WithSeeds names more nodes of a Sinew cluster, besides the address given
// to Dial. In a cluster each partition has one owner, the node that serves
// its publishes; a node that does not own it answers not_owner and names
// the owner. The client sends each publish to its queue's owner as far as
// it knows, follows not_owner, and when the owner stops answering (it
// died, and another replica takes over) sends again through the seeds
// until the new owner confirms. A publish keeps its producer id and
// sequence across these resends, so the cluster stores it once.
//
// With seeds a publish is also hedged: one not confirmed within 500 ms of
// its first send (a node cut off says nothing until its connection is
// given up; a quick refusal does not disarm it) is sent once more, with
// the same producer id and sequence, to the partition's owner as METADATA
// names it then, and the first confirm is the outcome. It is not hedged while METADATA still names the same owner
// and that node answers (a slow owner gets no second copy), nor when it
// has no producer id (WithProducerSequence with an empty id), since the
// cluster could then store it twice; at most 256 hedges are in flight per
// client. A publish is reported confirmed only once a broker confirmed it.
//
// With seeds, Subscribe spans the queue's owners: it subscribes on every
// node holding a replica of the queue, so one Subscription receives every
// partition, and a settle whose node was lost goes to the partition's new
// owner by the message's lease (see Subscribe). When no node answers
// METADATA, Subscribe asks again with backoff until its ctx ends (30 s
// when ctx has no deadline).
//
// With seeds the client also pings every clusterHeartbeatDefault (1 s)
// unless WithHeartbeat says otherwise, so a connection to a node cut off
// from it is given up after 3 s of silence, not three of the broker's
// intervals (10 s each by default).
//
// The client keeps a connection per node it uses. One to a node it no
// longer needs (not its own, not a seed, not an owner or replica of a
// queue it uses, and with no publish, settle or subscription on it) is
// closed after 30 s idle, so a dead node is not redialled for ever; at
// most 128 are kept beyond those in use.
//
// Without seeds the client learns the cluster from the node it dialled:
// on its first publish or subscribe it asks that node METADATA for the
// queue, and when the answer says the node is clustered the client routes
// as with seeds (hedges included), using the replicas that answer names as
// its other nodes (at most 64 learned addresses). A single broker answers
// that it is not clustered, and the client then behaves as before.
//
// In a cluster an unavailable, fenced or not_owner (naming no owner) answer
// drops the node that gave it as the partition's owner: for shunAfterRefusal
// the publish is sent to the other nodes the client knows instead (a node
// that names the refusing node as owner counts as naming none), and its
// hedge stays armed. Retries back off (20 ms growing to 200 ms, then 1 s
// after 64 sends) and last until the publish's ctx ends, or for
// routeRetryMax (60 s) from the first send when ctx has no deadline.
//
// A node that announces a planned stop (GOING_AWAY) with a redirect, an
// address of a node that stays up, is left at once: the client learns the
// redirect, forgets the stopping node as an owner, and routes new work
// (and publishes the node refuses while draining) through the other nodes.
func WithSeeds(addrs ...string) Option {
	return func(o *options) { o.seeds = append(o.seeds, addrs...) }
}

// clusterHeartbeatDefault is the heartbeat of a client with seeds.
const clusterHeartbeatDefault = time.Second

// Bounds of routing one publish.
const (
	// routeHopsMax bounds the sends of one publish: redirects to an owner
	// and retries while a partition elects one. With the pauses below it
	// is reached only after about 16 minutes: ctx, or routeRetryMax, ends
	// the retries first.
	routeHopsMax = 1024
	// routeBackoffMin and routeBackoffMax bound the pause before a retry
	// that is not a plain redirect (no owner known, or the owner gone);
	// after routeBackoffSlowAfter sends the pause is routeBackoffSlow, so
	// a whole cluster down is not asked in a tight loop.
	routeBackoffMin       = 20 * time.Millisecond
	routeBackoffMax       = 200 * time.Millisecond
	routeBackoffSlowAfter = 64
	routeBackoffSlow      = time.Second
	// routeRedirectsFree is how many sends of one publish may follow a
	// not_owner at once, without a pause: past it every retry pauses,
	// so nodes naming each other as the owner are not asked in a loop.
	routeRedirectsFree = 8
	// routeRetryMax bounds the retries of a publish whose ctx has no
	// deadline, from its first send, on the client's clock.
	routeRetryMax = time.Minute
	// shunAfterRefusal is how long a node that refused a partition's
	// publish (unavailable, fenced, not_owner naming no owner) is passed
	// over for that partition, and not taken as its owner when another
	// node names it: about an election, after which it is asked again.
	shunAfterRefusal = time.Second
	// shunKeysMax bounds the partitions whose refusing nodes are kept;
	// shunNodesMax the nodes kept per partition.
	shunKeysMax  = 256
	shunNodesMax = 8
	// probesMax bounds the METADATA requests a client without seeds
	// sends to find out whether its node is clustered (a queue not found
	// yet, or a connection lost, leaves it undecided).
	probesMax = 16
	// routeOpenTimeout bounds connecting to an owner or a seed for the
	// first time; a node that does not answer within it is passed over.
	routeOpenTimeout = 2 * time.Second
)

// routeKey names where a publish goes: its queue, and its partition when
// it names one (-1 otherwise: any partition the node owns takes it).
type routeKey struct {
	topic, group string
	partition    int32
}

func keyOf(p *protocol.Publish) routeKey { return routeKey{p.Topic, p.Group, max(p.Partition, -1)} }

// router keeps the owner of each queue (and of each partition a publish
// named) the client publishes to, as not_owner answers named it, and
// re-sends publishes that must go elsewhere.
type router struct {
	c      *Client
	seeds  []string
	mu     sync.Mutex
	owners map[routeKey]string
	// clustered is set once a broker answered not_owner, or seeds were
	// given: connection losses and unavailable answers are then retried
	// through the cluster instead of waiting for one node.
	clustered atomic.Bool
	// learned are the cluster's nodes the client heard of besides its
	// own and the seeds (owners named by not_owner, replicas listed by
	// METADATA), oldest first, at most learnedMax: a cluster whose nodes
	// were all replaced since Dial is still found. Guarded by mu.
	learned []string
	// lookedAt is when resend last asked METADATA (unix ns; rate limit).
	lookedAt atomic.Int64

	// hedges holds a token per hedged publish in flight (at most
	// publishHedgesMax). hedgeMu serialises the hedges' METADATA lookups
	// and guards hedgeCache, their shared answers (hedge.go).
	hedges     chan struct{}
	hedgeMu    sync.Mutex
	hedgeCache map[queueName]cachedMetadata
	// onHedge, when set (by a test, before the first publish), is told
	// each hedge's outcome.
	onHedge func(outcome string)
	// replicas are the owners and replicas of each queue as the last
	// METADATA answer for it named them (at most replicaSetsMax queues):
	// the nodes the client currently needs. Guarded by mu.
	replicas map[queueName][]string
	// shunned are, per partition, the nodes that refused it lately and
	// until when (clock unix ns): see shunAfterRefusal. Guarded by mu.
	shunned map[routeKey][]shun
	// awayUntil holds, for a node that sent GOING_AWAY naming another, until
	// when (unix ns) it is passed over for every partition: its next
	// connection, made once the draining one is left, is still the node
	// about to stop.
	awayUntil map[string]int64

	// probe is what a client without seeds found out about its node:
	// probeUnknown, probeSingle or probeCluster; probes counts the
	// METADATA requests sent to find out, probedAt is the last (unix ns).
	probe    atomic.Int32
	probes   atomic.Int32
	probedAt atomic.Int64
}

// A refusing node and until when it is passed over (clock unix ns).
type shun struct {
	addr  string
	until int64
}

// States of router.probe.
const (
	probeUnknown = iota
	probeSingle
	probeCluster
)

// replicaSetsMax bounds the queues whose replicas the router keeps.
const replicaSetsMax = 256

// noteReplicas records md's owners and replicas as topic's current nodes.
func (r *router) noteReplicas(topic, group string, md *protocol.MetadataResult) {
	var addrs []string
	for _, pm := range md.Partitions {
		for _, a := range append([]string{pm.Owner}, pm.Replicas...) {
			if a != "" && !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	k := queueName{topic, group}
	if _, ok := r.replicas[k]; !ok && len(r.replicas) >= replicaSetsMax {
		clear(r.replicas)
	}
	r.replicas[k] = addrs
}

// protected returns the addresses whose endpoints are never retired: the
// client's own, the seeds, and the owners and replicas it knows now.
func (r *router) protected() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := map[string]bool{r.c.ep.addr: true}
	for _, a := range r.seeds {
		keep[a] = true
	}
	for _, a := range r.owners {
		keep[a] = true
	}
	for _, as := range r.replicas {
		for _, a := range as {
			keep[a] = true
		}
	}
	return keep
}

// unlearn drops addr from the learned nodes: its endpoint was retired
// while it could not connect, and no queue the client uses names it.
func (r *router) unlearn(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.learned = slices.DeleteFunc(r.learned, func(a string) bool { return a == addr })
}

// ownersMax bounds the partitions whose owner a client remembers: past it
// the map starts over (an owner not known is asked for, or found by a
// not_owner answer).
const ownersMax = 65536

// setOwnerLocked records addr as the owner of k's partition. r.mu held.
func (r *router) setOwnerLocked(k routeKey, addr string) {
	if _, known := r.owners[k]; !known && len(r.owners) >= ownersMax {
		r.owners = make(map[routeKey]string)
	}
	r.owners[k] = addr
}

// learnedMax bounds the node addresses a client learns.
const learnedMax = 64

// lookEvery bounds how often resend asks METADATA to learn nodes.
const lookEvery = 500 * time.Millisecond

// learn records addrs as nodes of the cluster.
func (r *router) learn(addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range addrs {
		if a == "" || a == r.c.ep.addr || slices.Contains(r.seeds, a) || slices.Contains(r.learned, a) {
			continue
		}
		if len(r.learned) >= learnedMax {
			r.learned = r.learned[1:]
		}
		r.learned = append(r.learned, a)
	}
}

// look asks METADATA for p's queue (Client.metadata) and learns its
// replicas and owners. At most once per lookEvery.
func (r *router) look(ctx context.Context, p *protocol.Publish) {
	now := r.c.o.clock.Now().UnixNano()
	last := r.lookedAt.Load()
	if now-last < int64(lookEvery) || !r.lookedAt.CompareAndSwap(last, now) {
		return
	}
	if md, err := r.c.metadata(ctx, p.Topic, p.Group, ""); err == nil { // learns the replicas
		for _, pm := range md.Partitions {
			r.learn(pm.Owner)
		}
	}
}

// nodes lists the addresses the client knows: its own, the seeds, then
// the nodes it learned.
func (r *router) nodes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Concat([]string{r.c.ep.addr}, r.seeds, r.learned)
}

func newRouter(c *Client, seeds []string) *router {
	r := &router{c: c, seeds: seeds, owners: map[routeKey]string{},
		hedges: make(chan struct{}, publishHedgesMax), hedgeCache: map[queueName]cachedMetadata{},
		replicas: map[queueName][]string{}, shunned: map[routeKey][]shun{}, awayUntil: map[string]int64{}}
	r.clustered.Store(len(seeds) > 0)
	if len(seeds) > 0 {
		r.probe.Store(probeCluster)
	}
	return r
}

// shunNode passes addr over as p's partition's node for shunAfterRefusal.
func (r *router) shunNode(p *protocol.Publish, addr string) {
	k := keyOf(p)
	until := r.c.o.clock.Now().Add(shunAfterRefusal).UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.shunned[k]; !ok && len(r.shunned) >= shunKeysMax {
		clear(r.shunned)
	}
	l := slices.DeleteFunc(r.shunned[k], func(s shun) bool { return s.addr == addr })
	if len(l) >= shunNodesMax {
		l = l[1:]
	}
	r.shunned[k] = append(l, shun{addr, until})
}

// isShunned reports whether addr refused p's partition within
// shunAfterRefusal.
func (r *router) isShunned(p *protocol.Publish, addr string) bool {
	now := r.c.o.clock.Now().UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	if until, ok := r.awayUntil[addr]; ok {
		if now < until {
			return true
		}
		delete(r.awayUntil, addr)
	}
	for _, s := range r.shunned[keyOf(p)] {
		if s.addr == addr {
			return now < s.until
		}
	}
	return false
}

// maybeProbe asks, in the background, whether a client without seeds
// dialled a node of a cluster (see WithSeeds), at most once per lookEvery
// and probesMax times in all, until it knows.
func (r *router) maybeProbe(topic, group string) {
	if r.probe.Load() != probeUnknown || r.probes.Load() >= probesMax {
		return
	}
	now := r.c.o.clock.Now().UnixNano()
	last := r.probedAt.Load()
	if last != 0 && now-last < int64(lookEvery) || !r.probedAt.CompareAndSwap(last, now) {
		return
	}
	r.probes.Add(1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), routeOpenTimeout)
		defer cancel()
		r.probeNow(ctx, topic, group)
	}()
}

// clusteredFor reports whether the client routes in a cluster, asking its
// node first (probeNow) while that is undecided and probes are left.
func (r *router) clusteredFor(ctx context.Context, topic, group string) bool {
	if r.clustered.Load() {
		return true
	}
	if r.probe.Load() != probeUnknown || r.probes.Add(1) > probesMax {
		return false
	}
	return r.probeNow(ctx, topic, group) == probeCluster
}

// probeNow asks the client's node METADATA for a queue and records what
// the answer says: a cluster (its replicas and owners become known nodes)
// or a single broker (also one that does not know METADATA). It returns
// the state it leaves.
func (r *router) probeNow(ctx context.Context, topic, group string) int32 {
	if st := r.probe.Load(); st != probeUnknown {
		return st
	}
	if r.c.ep.single.Load() {
		// Its HELLO_OK said it runs alone: nothing to ask.
		r.probe.CompareAndSwap(probeUnknown, probeSingle)
		return r.probe.Load()
	}
	actx, cancel := context.WithTimeout(ctx, metadataAskTimeout)
	md, err := r.c.ep.metadata(actx, topic, group)
	cancel()
	var be *BrokerError
	switch {
	case err == nil && md.Cluster:
		r.clustered.Store(true)
		for _, pm := range md.Partitions {
			r.learn(pm.Owner)
			r.learn(pm.Replicas...)
		}
		r.noteReplicas(topic, group, md)
		if r.probe.CompareAndSwap(probeUnknown, probeCluster) {
			r.c.o.logger.Info("sinew: the node is clustered; routing through its nodes", "addr", r.c.ep.addr,
				"nodes", len(r.nodes()))
		}
	case err == nil, errors.As(err, &be) && be.Code == protocol.CodeUnknownOp:
		r.probe.CompareAndSwap(probeUnknown, probeSingle)
	}
	return r.probe.Load()
}

// endpointFor is where a publish to p's queue goes first: the client's
// own node; in a cluster its known owner, or, while the client's node is
// down, the first node of the seeds that answers.
func (r *router) endpointFor(ctx context.Context, p *protocol.Publish) *endpoint {
	if !r.clustered.Load() {
		r.maybeProbe(p.Topic, p.Group)
		return r.c.ep
	}
	e, _ := r.pick(ctx, p)
	return e
}

// send submits p on e, whose window holds size bytes for it; hop counts
// the sends so far. The outcome resolves fl, unless it says the publish
// belongs elsewhere: then it is sent again. In a cluster a publish not
// confirmed within publishHedgeAfter of its first send may also be hedged
// (see hedge.go); a quick refusal does not disarm it.
func (r *router) send(ctx context.Context, e *endpoint, p *protocol.Publish, fl *flight, size, hop int) {
	var taken atomic.Bool // done or reroute: exactly one runs
	fl.sending(e, r.c.o.clock.Now().UnixNano())
	cl := &call{body: r.c.stamped(p, fl), replay: true}
	cl.done = func(b protocol.Body, err error) {
		if !taken.CompareAndSwap(false, true) {
			return
		}
		e.window.release(size)
		if ok, isOK := b.(*protocol.PublishOK); isOK && err == nil && len(p.Key) == 0 {
			r.c.hints.note(p.Topic, p.Group, ok.Next)
		}
		if fl.resolved() {
			return // the hedge was confirmed first: this answer is dropped
		}
		if err != nil && fl.hinted.Load() && protocol.CodeOf(err) == protocol.CodeNotFound && !cl.uncertain &&
			r.inBudget(ctx, fl) && fl.unhint() {
			// The hinted partition is gone (the queue was declared
			// again with fewer) and no send of this publish may have
			// been stored: it goes again as the application sent it,
			// without a partition.
			r.c.hints.drop(p.Topic, p.Group)
			unhinted := *p
			unhinted.Partition = -1
			r.c.lanes.unsent(fl, p.ProducerSeq)
			go r.resend(ctx, &unhinted, fl, size, hop+1, err)
			return
		}
		if err != nil && hop < routeHopsMax && r.inBudget(ctx, fl) {
			// Marked before the resend starts, here where the answers
			// arrive in order (order.go, unsent).
			switch r.retry(p, err, e) {
			case retryNow:
				r.c.lanes.unsent(fl, p.ProducerSeq)
				go r.resend(ctx, p, fl, size, hop+1, err)
				return
			case retryIfClustered:
				r.c.lanes.unsent(fl, p.ProducerSeq)
				go r.resendIfClustered(ctx, e, p, fl, size, hop+1, err)
				return
			case retryInOrder:
				r.c.lanes.unsent(fl, p.ProducerSeq)
				go r.resendInOrder(ctx, p, fl, size, hop+1, err)
				return
			}
		}
		fl.finish(b, err)
	}
	if r.clustered.Load() {
		// The connection broke before the confirm: in a cluster the
		// owner may be gone for good, so the publish is sent again
		// through the cluster instead of waiting for this node.
		cl.reroute = func(cause error) bool {
			if !taken.CompareAndSwap(false, true) {
				return true
			}
			e.window.release(size)
			r.forget(p, e.addr)
			fl.uncertain.Store(true)
			r.c.lanes.unsent(fl, p.ProducerSeq)
			if !fl.resolved() {
				go r.resend(ctx, p, fl, size, hop+1, cause)
			}
			return true
		}
	}
	if r.hedgeable(p, fl) && fl.arm() {
		// Armed once per publish, before the submit, whose answer may
		// come at once; only the publish's outcome disarms it.
		fl.setDisarm(afterFunc(r.c.o.clock, publishHedgeAfter, func() {
			if !fl.resolved() {
				r.hedge(ctx, fl.endpoint(), p, fl, size)
			}
		}))
	}
	if r.clustered.Load() {
		// Never wait for this node's reconnect: it may be gone for good.
		e.submitNow(ctx, cl)
	} else {
		e.submit(ctx, cl)
	}
	// Queued: later publishes of its lane link to it (order.go).
	r.c.lanes.sent(fl, p.ProducerSeq)
}

// inBudget reports whether fl may be sent again: its ctx goes on, and when
// ctx has no deadline, routeRetryMax has not passed since its first send.
func (r *router) inBudget(ctx context.Context, fl *flight) bool {
	if ctx.Err() != nil {
		return false
	}
	if _, ok := ctx.Deadline(); ok {
		return true
	}
	return r.c.o.clock.Now().UnixNano()-fl.startedAt() < int64(routeRetryMax)
}

// What retry decides.
type retryKind int

const (
	retryNo          retryKind = iota // the answer is the outcome
	retryNow                          // send again (resend)
	retryIfClustered                  // send again if the client's node is clustered (resendIfClustered)
	retryInOrder                      // send again once the publish it follows resolves (resendInOrder)
)

// retry reports whether err means p should be sent again elsewhere, and
// records what it teaches: a not_owner names the owner; a refusal
// (unavailable, fenced, not_owner naming no one) drops its node as the
// owner and passes it over for a while.
func (r *router) retry(p *protocol.Publish, err error, from *endpoint) retryKind {
	var be *BrokerError
	if errors.As(err, &be) {
		switch be.Code {
		case protocol.CodeNotOwner:
			if be.Owner == "" {
				return r.refused(p, from)
			}
			r.clustered.Store(true)
			r.learn(be.Owner)
			if r.isShunned(p, be.Owner) {
				// It names a node that refused the partition just now:
				// its view is older, so it is passed over too, and no
				// owner is known yet.
				r.shunNode(p, from.addr)
				return retryNow
			}
			r.mu.Lock()
			r.setOwnerLocked(keyOf(p), be.Owner)
			r.mu.Unlock()
			return retryNow
		case protocol.CodeUnavailable, protocol.CodeFenced:
			// An election under way, a queue the cluster is creating, or
			// a node cut off from the cluster's majority.
			return r.refused(p, from)
		case protocol.CodeOutOfSequence:
			// The publish it follows is not stored yet (order.go): the
			// node is right, the order of arrival was not.
			return retryInOrder
		case protocol.CodeShuttingDown:
			// The node is draining (a restart, or leaving the cluster for
			// good) and stored nothing: another node takes it.
			if !r.clustered.Load() {
				return retryNo
			}
			r.forget(p, from.addr)
			return retryNow
		}
		return retryNo
	}
	if r.clustered.Load() && (errors.Is(err, ErrConnectionLost) || errors.Is(err, ErrNotConnected) || errors.Is(err, ErrDisconnected)) {
		r.forget(p, from.addr)
		return retryNow
	}
	return retryNo
}

// refused handles from's refusal of p's partition: in a cluster the node
// is dropped as its owner and passed over for shunAfterRefusal, and p is
// sent to the other nodes. A client without seeds that does not know yet
// whether its node is clustered asks first (resendIfClustered); a single
// broker's refusal is the outcome, as it always was.
func (r *router) refused(p *protocol.Publish, from *endpoint) retryKind {
	if !r.clustered.Load() {
		if r.probe.Load() == probeUnknown && r.probes.Load() < probesMax {
			return retryIfClustered
		}
		return retryNo
	}
	r.forget(p, from.addr)
	r.shunNode(p, from.addr)
	return retryNow
}

// resendIfClustered asks the client's node whether it is clustered (once
// per client, up to probesMax times while undecided) and sends p again
// through the cluster if it is; otherwise cause is p's outcome.
func (r *router) resendIfClustered(ctx context.Context, from *endpoint, p *protocol.Publish, fl *flight, size, hop int, cause error) {
	r.probes.Add(1)
	if r.probeNow(ctx, p.Topic, p.Group) != probeCluster {
		fl.finish(nil, cause)
		return
	}
	r.refused(p, from)
	r.resend(ctx, p, fl, size, hop, cause)
}

// resendInOrder sends p again after an out_of_sequence refusal, once the
// publish it follows resolved (at most orderWaitMax), with a new link and
// without resend's pause: the wait was the pause.
func (r *router) resendInOrder(ctx context.Context, p *protocol.Publish, fl *flight, size, hop int, cause error) {
	if !r.c.waitPrev(ctx, p, fl) {
		return
	}
	r.resend(ctx, p, fl, size, hop, cause)
}

// forget drops addr as p's queue's owner.
func (r *router) forget(p *protocol.Publish, addr string) {
	k := keyOf(p)
	r.mu.Lock()
	if r.owners[k] == addr {
		delete(r.owners, k)
	}
	r.mu.Unlock()
}

// away handles a GOING_AWAY whose redirect names a node that stays up:
// the client learns it, takes addr as an owner of nothing, and so routes
// new work for addr's partitions through the other nodes at once.
func (r *router) away(addr, redirect string) {
	r.clustered.Store(true)
	r.probe.CompareAndSwap(probeUnknown, probeCluster)
	r.learn(redirect)
	r.mu.Lock()
	for k, a := range r.owners {
		if a == addr {
			delete(r.owners, k)
		}
	}
	if len(r.awayUntil) < learnedMax {
		r.awayUntil[addr] = r.c.o.clock.Now().Add(awayShunFor).UnixNano()
	}
	r.mu.Unlock()
}

// awayShunFor is how long a node that sent GOING_AWAY with a redirect is
// passed over (isShunned): long enough for its drain and restart to begin.
const awayShunFor = 10 * time.Second

// resend sends p again, after a pause unless the last answer named the
// owner, to the owner if it is reachable, else to the first node of the
// client's own, the seeds and the learned ones that is, passing over the
// nodes that refused the partition lately.
func (r *router) resend(ctx context.Context, p *protocol.Publish, fl *flight, size, hop int, cause error) {
	var be *BrokerError
	redirect := errors.As(cause, &be) && be.Code == protocol.CodeNotOwner && be.Owner != "" && !r.isShunned(p, be.Owner)
	inOrder := errors.As(cause, &be) && be.Code == protocol.CodeOutOfSequence
	// Ownership moved, or the node is gone or going: the cluster may be
	// changing around the client (nodes replaced), so learn where the
	// queue's replicas are now, while some node it knows still answers
	// (in the background: the publish does not wait for it).
	if !inOrder {
		go r.look(context.WithoutCancel(ctx), p)
	}
	if !inOrder && (!redirect || hop > routeRedirectsFree) {
		// No owner to go to at once: a pause, growing with the hops,
		// while the partition elects one or the node comes back.
		d := min(routeBackoffMin<<min(hop, 8), routeBackoffMax)
		if hop > routeBackoffSlowAfter {
			d = routeBackoffSlow
		}
		select {
		case <-r.c.o.clock.After(d):
		case <-fl.f.done:
			return // the hedge was confirmed meanwhile
		case <-ctx.Done():
			fl.finish(nil, ctx.Err())
			return
		}
	}
	e, _ := r.pick(ctx, p)
	if err := e.window.acquire(ctx, e.quit, size); err != nil {
		if errors.Is(err, ErrClientClosed) && !r.c.isClosed() && hop < routeHopsMax {
			// e was retired from the pool meanwhile (the client is not
			// closing): choose again.
			go r.resend(ctx, p, fl, size, hop+1, err)
			return
		}
		fl.finish(nil, err)
		return
	}
	if fl.resolved() {
		e.window.release(size)
		return
	}
	r.send(ctx, e, p, fl, size, hop)
}

// pick chooses where to send p: its owner if connected (or connectable)
// and it has not refused the partition lately, else the first connected
// (or connectable) of the client's node, the seeds and the nodes it
// learned that has not, else the first of those that refused it, else the
// client's node, whose reconnects the send then waits for. owner reports
// whether it is p's owner.
func (r *router) pick(ctx context.Context, p *protocol.Publish) (e *endpoint, owner bool) {
	r.mu.Lock()
	addr := r.owners[keyOf(p)]
	r.mu.Unlock()
	if addr != "" && !r.isShunned(p, addr) {
		if e := r.c.pool.get(addr); r.reachable(ctx, e) {
			return e, true
		}
		r.forget(p, addr)
	}
	var shunned []string
	for _, a := range r.nodes() {
		if r.isShunned(p, a) {
			shunned = append(shunned, a)
			continue
		}
		if e := r.c.pool.get(a); r.reachable(ctx, e) {
			return e, false
		}
	}
	// Every node refused it lately: the one that did so first.
	r.mu.Lock()
	l := slices.Clone(r.shunned[keyOf(p)])
	r.mu.Unlock()
	slices.SortStableFunc(l, func(a, b shun) int { return cmp.Compare(a.until, b.until) })
	for _, s := range l {
		if !slices.Contains(shunned, s.addr) {
			continue
		}
		if e := r.c.pool.get(s.addr); r.reachable(ctx, e) {
			return e, false
		}
	}
	return r.c.ep, false
}

// reachable reports whether e has a connection that takes new work,
// connecting it first if it never had one.
func (r *router) reachable(ctx context.Context, e *endpoint) bool {
	if c := e.live.Load(); c != nil {
		// A draining node (GOING_AWAY) takes no new work.
		return !c.draining.Load()
	}
	if e.wasOpened() {
		return false // reconnecting: the node is down or cut off
	}
	octx, cancel := context.WithTimeout(ctx, routeOpenTimeout)
	defer cancel()
	return e.openOnce(octx) == nil
}
