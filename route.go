package sinew

import (
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
// With seeds a publish is also hedged: one its owner has not confirmed
// within 1 s (a node cut off says nothing until its connection is given
// up) is sent once more, with the same producer id and sequence, to the
// partition's owner as METADATA names it then, and the first confirm is
// the outcome. It is not hedged while METADATA still names the same owner
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
// Without seeds the client also follows not_owner, but has no other node
// to turn to while its own is down.
func WithSeeds(addrs ...string) Option {
	return func(o *options) { o.seeds = append(o.seeds, addrs...) }
}

// clusterHeartbeatDefault is the heartbeat of a client with seeds.
const clusterHeartbeatDefault = time.Second

// Bounds of routing one publish.
const (
	// routeHopsMax bounds the sends of one publish: redirects to an owner
	// and retries while a partition elects one.
	routeHopsMax = 256
	// routeBackoffMin and routeBackoffMax bound the pause before a retry
	// that is not a plain redirect (no owner known, or the owner gone).
	routeBackoffMin = 20 * time.Millisecond
	routeBackoffMax = 200 * time.Millisecond
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
}

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
		replicas: map[queueName][]string{}}
	r.clustered.Store(len(seeds) > 0)
	return r
}

// endpointFor is where a publish to p's queue goes first: the client's
// own node; in a cluster its known owner, or, while the client's node is
// down, the first node of the seeds that answers.
func (r *router) endpointFor(ctx context.Context, p *protocol.Publish) *endpoint {
	if !r.clustered.Load() {
		return r.c.ep
	}
	e, _ := r.pick(ctx, p)
	return e
}

// send submits p on e, whose window holds size bytes for it; hop counts
// the sends so far. The outcome resolves fl, unless it says the publish
// belongs elsewhere: then it is sent again. In a cluster a send not
// answered within publishHedgeAfter may also be hedged (see hedge.go).
func (r *router) send(ctx context.Context, e *endpoint, p *protocol.Publish, fl *flight, size, hop int) {
	var taken atomic.Bool // done or reroute: exactly one runs
	stopHedge := func() {}
	cl := &call{body: p, replay: true}
	cl.done = func(b protocol.Body, err error) {
		if !taken.CompareAndSwap(false, true) {
			return
		}
		stopHedge()
		e.window.release(size)
		if fl.resolved() {
			return // the hedge was confirmed first: this answer is dropped
		}
		if err != nil && r.retry(p, err, e) && hop < routeHopsMax && ctx.Err() == nil {
			go r.resend(ctx, p, fl, size, hop+1, err)
			return
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
			stopHedge()
			e.window.release(size)
			r.forget(p, e.addr)
			if !fl.resolved() {
				go r.resend(ctx, p, fl, size, hop+1, cause)
			}
			return true
		}
	}
	if r.hedgeable(p, fl) {
		// Armed before the submit, whose answer may come at once.
		stopHedge = afterFunc(r.c.o.clock, publishHedgeAfter, func() {
			if !taken.Load() {
				r.hedge(ctx, e, p, fl, size)
			}
		})
	}
	if r.clustered.Load() {
		// Never wait for this node's reconnect: it may be gone for good.
		e.submitNow(ctx, cl)
		return
	}
	e.submit(ctx, cl)
}

// retry reports whether err means p should be sent again elsewhere, and
// records what it teaches: a not_owner names the owner.
func (r *router) retry(p *protocol.Publish, err error, from *endpoint) bool {
	var be *BrokerError
	if errors.As(err, &be) {
		switch be.Code {
		case protocol.CodeNotOwner:
			if be.Owner == "" {
				return false
			}
			r.clustered.Store(true)
			r.mu.Lock()
			r.owners[keyOf(p)] = be.Owner
			r.mu.Unlock()
			r.learn(be.Owner)
			return true
		case protocol.CodeUnavailable, protocol.CodeFenced:
			// An election under way, a queue the cluster is creating, or
			// a node cut off from the cluster's majority.
			return r.clustered.Load()
		case protocol.CodeShuttingDown:
			// The node is draining (a restart, or leaving the cluster for
			// good) and stored nothing: another node takes it.
			if !r.clustered.Load() {
				return false
			}
			r.forget(p, from.addr)
			return true
		}
		return false
	}
	if r.clustered.Load() && (errors.Is(err, ErrConnectionLost) || errors.Is(err, ErrNotConnected) || errors.Is(err, ErrDisconnected)) {
		r.forget(p, from.addr)
		return true
	}
	return false
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

// resend sends p again, after a pause unless the last answer named the
// owner, to the owner if it is reachable, else to the first node of the
// client's own and the seeds that is.
func (r *router) resend(ctx context.Context, p *protocol.Publish, fl *flight, size, hop int, cause error) {
	var be *BrokerError
	redirect := errors.As(cause, &be) && be.Code == protocol.CodeNotOwner
	// Ownership moved, or the node is gone or going: the cluster may be
	// changing around the client (nodes replaced), so learn where the
	// queue's replicas are now, while some node it knows still answers
	// (in the background: the publish does not wait for it).
	go r.look(context.WithoutCancel(ctx), p)
	e, owner := r.pick(ctx, p)
	if !redirect || !owner {
		// No owner to go to at once: a pause, growing with the hops,
		// while the partition elects one or the node comes back.
		d := min(routeBackoffMin<<min(hop, 8), routeBackoffMax)
		select {
		case <-r.c.o.clock.After(d):
		case <-fl.f.done:
			return // the hedge was confirmed meanwhile
		case <-ctx.Done():
			fl.finish(nil, ctx.Err())
			return
		}
	}
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

// pick chooses where to send p: its owner if connected (or connectable),
// else the first connected (or connectable) of the client's node, the
// seeds and the nodes it learned, else the client's node, whose reconnects the send then waits for.
// owner reports whether it is p's owner.
func (r *router) pick(ctx context.Context, p *protocol.Publish) (e *endpoint, owner bool) {
	r.mu.Lock()
	addr := r.owners[keyOf(p)]
	r.mu.Unlock()
	if addr != "" {
		if e := r.c.pool.get(addr); r.reachable(ctx, e) {
			return e, true
		}
		r.forget(p, addr)
	}
	for _, a := range r.nodes() {
		if e := r.c.pool.get(a); r.reachable(ctx, e) {
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
