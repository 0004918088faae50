package sinew

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/sinewmq/sinew/protocol"
)

// fakeBroker is a small in-memory broker speaking protocol v1 for SDK tests: one
// partition per queue, sessions that can be resumed, prefetch-bounded dispatch,
// settles, reconciliation and GOING_AWAY. One mutex guards everything; frames are
// written under it (tests are small and the SDK always reads).
type fakeBroker struct {
	t  *testing.T
	ln net.Listener

	mu         sync.Mutex
	token      string
	resumable  bool // keep dropped sessions resumable
	heartbeat  uint32
	inflight   uint32
	generation uint64
	sessions   map[string]*fSession
	queues     map[string]*fQueue
	conns      map[*fConn]struct{}
	nextSub    uint64
	nextSess   int
	hellos     []protocol.Hello
	recreate   bool            // answer missing subscriptions with "recreate client side"
	refuseSubs map[string]bool // topics whose SUBSCRIBE fails with unavailable
	// holdPublishes leaves publishes unanswered and unstored (counted in
	// heldPublishes), as if the broker died before they were durable.
	holdPublishes bool
	heldPublishes []protocol.Publish
	// refusePublishes answers that many publishes shutting_down (not
	// fatal), as a draining broker answers one that crossed its GOING_AWAY.
	refusePublishes int
	// refuseSubscribes does the same for that many SUBSCRIBEs.
	refuseSubscribes int
	// heldReqs are where the held publishes came from, for releaseHeld.
	heldReqs []heldReq
	// silent drops every frame after the handshake unanswered, as a node
	// whose link is cut (no reset) looks to the client.
	silent bool
	// publishErr, when set and returning non-nil, answers a publish with
	// that error (nothing stored).
	publishErr func(m *protocol.Publish) *protocol.ErrorBody
	// metadata, when set, answers METADATA (unknown_op otherwise).
	metadata func(m *protocol.Metadata) protocol.Body
	// ops counts the frames received after the handshake by op, silent
	// ones included; changed is closed and replaced after each.
	ops     map[protocol.Op]int
	changed chan struct{}
	wg      sync.WaitGroup
}

type heldReq struct {
	c  *fConn
	id uint64
}

type fSession struct {
	id, token string
	conn      *fConn
	subs      map[uint64]*fSub
	tags      map[uint64]*fLease
	nextTag   uint64
}

type fSub struct {
	id       uint64
	sess     *fSession
	view     protocol.SubView
	q        *fQueue
	inflight int
}

type fLease struct {
	sub *fSub
	msg *fMsg
}

type fMsg struct {
	offset  uint64
	attempt uint32
	pub     protocol.Publish
}

type fQueue struct {
	name  string
	next  uint64
	ready []*fMsg
	acked int
	rr    int
}

type fConn struct {
	nc   net.Conn
	w    *bufio.Writer
	sess *fSession
}

func newFakeBroker(t *testing.T) *fakeBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &fakeBroker{t: t, ln: ln, resumable: true, inflight: 256, generation: 1,
		sessions: map[string]*fSession{}, queues: map[string]*fQueue{}, conns: map[*fConn]struct{}{},
		ops: map[protocol.Op]int{}, changed: make(chan struct{}),
	}
	b.wg.Add(1)
	go b.accept()
	t.Cleanup(b.close)
	return b
}

func (b *fakeBroker) addr() string { return b.ln.Addr().String() }

func (b *fakeBroker) close() {
	_ = b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		_ = c.nc.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

func (b *fakeBroker) accept() {
	defer b.wg.Done()
	for {
		nc, err := b.ln.Accept()
		if err != nil {
			return
		}
		c := &fConn{nc: nc, w: bufio.NewWriter(nc)}
		b.mu.Lock()
		b.conns[c] = struct{}{}
		b.mu.Unlock()
		b.wg.Add(1)
		go b.serve(c)
	}
}

// write sends one frame; b.mu held.
func (c *fConn) write(flags uint16, id uint64, body protocol.Body) {
	_, _ = c.w.Write(protocol.AppendFrame(nil, flags, id, body))
	_ = c.w.Flush()
}

func (b *fakeBroker) serve(c *fConn) {
	defer b.wg.Done()
	defer func() {
		_ = c.nc.Close()
		b.mu.Lock()
		delete(b.conns, c)
		b.detach(c)
		close(b.changed)
		b.changed = make(chan struct{})
		b.mu.Unlock()
	}()
	r := bufio.NewReader(c.nc)
	for {
		f, _, err := protocol.ReadFrame(r, protocol.FrameBytesDefault, nil)
		if err != nil {
			return
		}
		body, err := protocol.Decode(f)
		if err != nil {
			return
		}
		b.mu.Lock()
		ok := b.handle(c, f, body)
		b.mu.Unlock()
		if !ok {
			return
		}
	}
}

// detach drops the connection from its session; b.mu held.
func (b *fakeBroker) detach(c *fConn) {
	s := c.sess
	if s == nil || s.conn != c {
		return
	}
	s.conn = nil
	if !b.resumable {
		b.dropSession(s)
	}
}

func (b *fakeBroker) dropSession(s *fSession) {
	for _, l := range s.tags {
		l.sub.q.ready = append([]*fMsg{l.msg}, l.sub.q.ready...)
	}
	delete(b.sessions, s.id)
	b.dispatchAll()
}

func (b *fakeBroker) handle(c *fConn, f protocol.Frame, body protocol.Body) bool {
	id := f.RequestID
	if c.sess == nil {
		h, ok := body.(*protocol.Hello)
		if !ok {
			c.write(0, id, &protocol.ErrorBody{Code: protocol.CodeHandshakeRequired, Fatal: true})
			return false
		}
		b.hellos = append(b.hellos, *h)
		if b.token != "" && h.Credentials != b.token {
			c.write(0, id, &protocol.ErrorBody{Code: protocol.CodeAuthFailed, Message: "bad token", Fatal: true})
			return false
		}
		outcome := protocol.ResumeNew
		var s *fSession
		if h.Resume.ClientID != "" {
			if old := b.sessions[h.Resume.ClientID]; old != nil && old.token == string(h.Resume.Token) {
				s, outcome = old, protocol.ResumeResumed
				if old.conn != nil {
					_ = old.conn.nc.Close()
				}
			} else {
				outcome = protocol.ResumeNotFound
			}
		}
		if s == nil {
			b.nextSess++
			s = &fSession{id: fmt.Sprintf("c-%d", b.nextSess), token: fmt.Sprintf("t-%d", b.nextSess),
				subs: map[uint64]*fSub{}, tags: map[uint64]*fLease{}}
			b.sessions[s.id] = s
		}
		s.conn = c
		c.sess = s
		// A fake answering METADATA as a cluster node says it is one.
		clustered := false
		if b.metadata != nil {
			mr, ok := b.metadata(&protocol.Metadata{}).(*protocol.MetadataResult)
			clustered = ok && mr.Cluster
		}
		c.write(0, id, &protocol.HelloOK{ProtocolVersion: 1, ServerVersion: "fake",
			Resume:  protocol.ResumeIdentity{ClientID: s.id, OwnerID: "fake", Token: []byte(s.token)},
			Outcome: outcome, ServerGeneration: b.generation, HeartbeatMs: b.heartbeat, ReconnectGraceMs: 5000,
			Limits: protocol.Limits{FrameBytesMax: 1 << 20, BodyBytesMax: 1 << 19, PrefetchMax: 1000,
				SettleBatchMax: 64, PublishInflightMax: b.inflight, SubscriptionsMax: 64},
			Cluster: clustered})
		b.dispatchAll()
		return true
	}
	s := c.sess
	b.ops[f.Op]++
	close(b.changed)
	b.changed = make(chan struct{})
	if b.silent {
		return true
	}
	switch m := body.(type) {
	case *protocol.Metadata:
		if b.metadata == nil {
			c.write(0, id, &protocol.ErrorBody{Code: protocol.CodeUnknownOp})
			return true
		}
		c.write(0, id, b.metadata(m))
	case *protocol.Ping:
		c.write(0, id, &protocol.Pong{})
	case *protocol.Pong:
	case *protocol.DeclareQueue:
		_, existed := b.queues[m.Topic]
		b.queue(m.Topic)
		c.write(0, id, &protocol.DeclareOK{Partitions: 1, Created: !existed})
	case *protocol.Publish:
		if b.publishErr != nil {
			if eb := b.publishErr(m); eb != nil {
				c.write(0, id, eb)
				return true
			}
		}
		if b.refusePublishes > 0 {
			b.refusePublishes--
			c.write(0, id, &protocol.ErrorBody{Code: protocol.CodeShuttingDown, Message: "broker is draining"})
			return true
		}
		if b.holdPublishes {
			b.heldPublishes = append(b.heldPublishes, *m)
			b.heldReqs = append(b.heldReqs, heldReq{c, id})
			return true
		}
		q := b.queue(m.Topic)
		msg := &fMsg{offset: q.next, pub: *m}
		msg.pub.Body = append([]byte(nil), m.Body...)
		q.next++
		q.ready = append(q.ready, msg)
		r := protocol.PublishOK{Partition: 0, Offset: msg.offset}
		if f.Flags&protocol.FlagNoReply == 0 {
			c.write(0, id, &r)
		}
		b.dispatch(q)
	case *protocol.Subscribe:
		if m.Topic == "" {
			c.write(0, id, &protocol.ErrorBody{Code: protocol.CodeBadRequest, Message: "empty topic"})
			return true
		}
		if b.refuseSubscribes > 0 {
			b.refuseSubscribes--
			c.write(0, id, &protocol.ErrorBody{Code: protocol.CodeShuttingDown, Message: "broker is draining"})
			return true
		}
		if b.refuseSubs[m.Topic] {
			c.write(0, id, &protocol.ErrorBody{Code: protocol.CodeUnavailable, Message: "refused"})
			return true
		}
		sub := b.newSub(s, protocol.SubView{Topic: m.Topic, Group: m.Group, Partition: m.Partition,
			AckMode: m.AckMode, Prefetch: m.Prefetch})
		c.write(0, id, &protocol.SubscribeOK{SubID: sub.id, Partitions: []uint32{0}, Prefetch: sub.prefetch()})
		b.dispatch(sub.q)
	case *protocol.Unsubscribe:
		sub := s.subs[m.SubID]
		if sub == nil {
			c.write(0, id, &protocol.ErrorBody{Code: protocol.CodeNotFound})
			return true
		}
		b.removeSub(sub)
		c.write(0, id, &protocol.OK{})
	case *protocol.Settle:
		codes := make([]protocol.Code, len(m.Tags))
		for i, tag := range m.Tags {
			l := s.tags[tag]
			if l == nil {
				codes[i] = protocol.CodeUnknownTag
				continue
			}
			delete(s.tags, tag)
			l.sub.inflight--
			switch m.Kind {
			case protocol.OpAck, protocol.OpFail:
				l.sub.q.acked++
			case protocol.OpNack:
				l.sub.q.ready = append(l.sub.q.ready, l.msg)
			}
			b.dispatch(l.sub.q)
		}
		if f.Flags&protocol.FlagNoReply == 0 {
			c.write(0, id, &protocol.SettleResult{Codes: codes})
		}
	case *protocol.Reconcile:
		var res protocol.ReconcileResult
		for _, v := range m.Subs {
			sub := s.subs[v.SubID]
			switch {
			case sub != nil:
				res.Entries = append(res.Entries, protocol.ReconcileEntry{Action: protocol.ActionKeep,
					ClientSubID: v.SubID, ServerSubID: v.SubID, Client: v, Server: sub.view, Reason: "matched"})
			case b.recreate:
				res.Entries = append(res.Entries, protocol.ReconcileEntry{Action: protocol.ActionRecreateClient,
					ClientSubID: v.SubID, Client: v, Reason: "missing"})
			case m.Policy == protocol.ReconcileRestore:
				sub := b.newSub(s, v)
				res.Entries = append(res.Entries, protocol.ReconcileEntry{Action: protocol.ActionKeep,
					ClientSubID: v.SubID, ServerSubID: sub.id, Client: v, Server: sub.view, Reason: "missing"})
			default:
				res.Entries = append(res.Entries, protocol.ReconcileEntry{Action: protocol.ActionCloseClientSide,
					ClientSubID: v.SubID, Client: v, Reason: "missing"})
			}
		}
		c.write(0, id, &res)
		b.dispatchAll()
	default:
		c.write(0, id, &protocol.ErrorBody{Code: protocol.CodeUnknownOp})
	}
	return true
}

func (sub *fSub) prefetch() uint32 {
	if sub.view.Prefetch == 0 {
		return 100
	}
	return sub.view.Prefetch
}

func (b *fakeBroker) queue(name string) *fQueue {
	q := b.queues[name]
	if q == nil {
		q = &fQueue{name: name}
		b.queues[name] = q
	}
	return q
}

func (b *fakeBroker) newSub(s *fSession, v protocol.SubView) *fSub {
	b.nextSub++
	v.SubID = b.nextSub
	sub := &fSub{id: b.nextSub, sess: s, view: v, q: b.queue(v.Topic)}
	s.subs[sub.id] = sub
	return sub
}

func (b *fakeBroker) removeSub(sub *fSub) {
	delete(sub.sess.subs, sub.id)
	for tag, l := range sub.sess.tags {
		if l.sub == sub {
			delete(sub.sess.tags, tag)
			sub.q.ready = append([]*fMsg{l.msg}, sub.q.ready...)
		}
	}
	b.dispatch(sub.q)
}

func (b *fakeBroker) dispatchAll() {
	for _, q := range b.queues {
		b.dispatch(q)
	}
}

// dispatch hands ready messages of q to attached subscriptions with free
// prefetch, round robin; b.mu held.
func (b *fakeBroker) dispatch(q *fQueue) {
	for len(q.ready) > 0 {
		var subs []*fSub
		for _, s := range b.sessions {
			if s.conn == nil {
				continue
			}
			for _, sub := range s.subs {
				if sub.q == q && (sub.view.AckMode == protocol.AckAuto || sub.inflight < int(sub.prefetch())) {
					subs = append(subs, sub)
				}
			}
		}
		if len(subs) == 0 {
			return
		}
		sub := subs[q.rr%len(subs)]
		q.rr++
		msg := q.ready[0]
		q.ready = q.ready[1:]
		msg.attempt++
		s := sub.sess
		s.nextTag++
		if sub.view.AckMode == protocol.AckManual {
			s.tags[s.nextTag] = &fLease{sub: sub, msg: msg}
			sub.inflight++
		} else {
			q.acked++
		}
		p := msg.pub
		s.conn.write(0, 0, &protocol.Deliver{SubID: sub.id, Tag: s.nextTag, Partition: 0, Offset: msg.offset,
			Attempt: msg.attempt, PublishedAtMs: 1, Key: p.Key, Headers: p.Headers, ContentType: p.ContentType,
			Body: p.Body, Topic: q.name, Group: p.Group})
	}
}

// cutAll closes every client connection from the server side.
func (b *fakeBroker) cutAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for c := range b.conns {
		_ = c.nc.Close()
	}
}

// goingAway pushes GOING_AWAY to every attached connection.
func (b *fakeBroker) goingAway(deadlineMs int64) { b.goingAwayTo(deadlineMs, "") }

// goingAwayTo pushes GOING_AWAY naming redirect to every attached
// connection.
func (b *fakeBroker) goingAwayTo(deadlineMs int64, redirect string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for c := range b.conns {
		if c.sess != nil {
			c.write(0, 0, &protocol.GoingAway{DeadlineMs: deadlineMs, GraceMs: 5000, Reason: "test", Redirect: redirect})
		}
	}
}

// forgetSessions drops every session, as a broker restart without grace would.
func (b *fakeBroker) forgetSessions() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.sessions {
		if s.conn != nil {
			_ = s.conn.nc.Close()
			s.conn = nil
		}
		b.dropSession(s)
	}
}

func (b *fakeBroker) set(f func(b *fakeBroker)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f(b)
}

func (b *fakeBroker) helloCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.hellos)
}

func (b *fakeBroker) lastHello() protocol.Hello {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hellos[len(b.hellos)-1]
}

// await waits until cond (called with b.mu held) holds, re-checking after
// every frame the broker receives.
func (b *fakeBroker) await(ctx context.Context, what string, cond func(b *fakeBroker) bool) {
	b.t.Helper()
	for {
		b.mu.Lock()
		ok := cond(b)
		ch := b.changed
		b.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			b.t.Fatalf("fake broker: %s: %v", what, ctx.Err())
		}
	}
}

// count returns how many frames of op the broker received.
func (b *fakeBroker) count(op protocol.Op) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ops[op]
}

// releaseHeld stores the held publishes and confirms them on the
// connections they came on.
func (b *fakeBroker) releaseHeld() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, m := range b.heldPublishes {
		q := b.queue(m.Topic)
		msg := &fMsg{offset: q.next, pub: m}
		q.next++
		q.ready = append(q.ready, msg)
		b.heldReqs[i].c.write(0, b.heldReqs[i].id, &protocol.PublishOK{Offset: msg.offset})
	}
	b.heldPublishes, b.heldReqs = nil, nil
	b.holdPublishes = false
}

// stored returns the publishes a queue holds (ready ones), in order.
func (b *fakeBroker) stored(topic string) []protocol.Publish {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []protocol.Publish
	if q := b.queues[topic]; q != nil {
		for _, m := range q.ready {
			out = append(out, m.pub)
		}
	}
	return out
}
