package membership

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Errors returned by this package.
var (
	// ErrBadConfig reports a Config or Profile that cannot run.
	ErrBadConfig = errors.New("membership: bad config")
	// ErrBadMeta reports node metadata a peer sent that does not decode.
	ErrBadMeta = errors.New("membership: bad node metadata")
)

// reconnectPeersMax bounds the peers one reconnect round tries to join, so
// a round costs at most this many dial timeouts.
const reconnectPeersMax = 8

// knownPeersMax bounds the addresses SetKnownPeers keeps.
const knownPeersMax = 1024

// Config configures a Membership.
type Config struct {
	// Meta is this node's metadata; Meta.NodeID is also its memberlist
	// name and must be unique in the cluster.
	Meta Meta
	// BindAddr and BindPort are the gossip address (UDP and TCP, same
	// port). Port 0 lets the operating system choose. Unused when
	// Transport is set.
	BindAddr string
	BindPort int
	// Profile is the failure detector's timing; zero means SeedProfile.
	Profile Profile
	// Seeds are the gossip addresses ("host:port") of nodes to join at
	// start, and again each ReconnectInterval while this node sees no
	// peer alive, while it is fenced, and for a while after start.
	Seeds []string
	// Transport replaces memberlist's UDP and TCP transport (tests wrap
	// it to cut links). Nil means memberlist's own, bound to BindAddr.
	Transport memberlist.Transport
	// Logger receives memberlist's log lines; nil discards them.
	Logger *log.Logger
	// SecretKey, when set (16, 24 or 32 bytes), encrypts and authenticates
	// every gossip message with memberlist's AES-GCM keyring; a node without
	// the same key is not heard. Nil: gossip in the clear.
	SecretKey []byte
	// LoadInterval is how often the node sends its load report (see
	// SetLoadSource); zero means LoadIntervalDefault.
	LoadInterval time.Duration
}

// State is a peer's state in this node's view.
type State uint8

// Peer states.
const (
	// StateAlive: memberlist lists the peer (alive or suspect: memberlist
	// does not say which, see the package doc).
	StateAlive State = iota + 1
	// StateDead: the suspicion timed out.
	StateDead
	// StateLeft: the peer said it was leaving.
	StateLeft
)

func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	}
	return "unknown(" + strconv.Itoa(int(s)) + ")"
}

// EventKind says what changed.
type EventKind uint8

// Event kinds.
const (
	// EventJoin: a peer appeared, or came back after dead or left.
	EventJoin EventKind = iota + 1
	// EventDead: a peer was declared dead.
	EventDead
	// EventLeave: a peer left.
	EventLeave
	// EventFenced: this node sees a majority of its peers dead.
	EventFenced
	// EventUnfenced: this node sees a majority of its peers again.
	EventUnfenced
	// EventIDConflict: another process announced this node's id from
	// another address (Event.Addr), e.g. one started on a copy of the
	// data directory.
	EventIDConflict
)

func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventDead:
		return "dead"
	case EventLeave:
		return "leave"
	case EventFenced:
		return "fenced"
	case EventUnfenced:
		return "unfenced"
	case EventIDConflict:
		return "id_conflict"
	}
	return "unknown(" + strconv.Itoa(int(k)) + ")"
}

// Event is the latest transition of one node not yet read from Events.
// Fenced and Unfenced events name this node.
type Event struct {
	Kind EventKind
	// Node is the peer's memberlist name (its node id).
	Node string
	// Meta is the peer's metadata; MetaErr is set if it did not decode.
	Meta    Meta
	MetaErr error
	// Coalesced counts earlier transitions of the same node that this
	// event replaced because the reader had not taken them yet.
	Coalesced int
	// Addr is the other address of an EventIDConflict.
	Addr string
}

// Member is one peer in the view.
type Member struct {
	Name    string
	Addr    string
	State   State
	Meta    Meta
	MetaErr error
}

// Stats counts what the view did.
type Stats struct {
	// Transitions is the number of peer state changes seen.
	Transitions uint64
	// Coalesced is the number of events replaced by a later one for the
	// same node before they were read.
	Coalesced uint64
	// ReconnectAttempts is the number of peers a reconnect round tried.
	ReconnectAttempts uint64
	// BadLoads is the number of load reports from peers that did not
	// decode (and were dropped).
	BadLoads uint64
}

// Membership is one node's view of the cluster. See the package doc.
type Membership struct {
	ml       *memberlist.Memberlist
	self     string
	selfMeta Meta
	meta     *metaDelegate
	profile  Profile
	seeds    []string
	// selfAddr is Addr, taken once at start (SetKnownPeers drops it).
	selfAddr string

	// started is when New ran; joinErr is the first join's error (nil
	// when a seed answered, or when there were no seeds).
	started time.Time
	joinErr error

	kick  chan struct{} // cap 1: an event is pending
	nudge chan struct{} // cap 1: SetKnownPeers brought a new address
	out   chan Event
	stop  chan struct{}
	wg    sync.WaitGroup

	closeOnce sync.Once

	// mu guards everything below. It is never held while calling into
	// memberlist, and memberlist's delegates take only mu.
	mu      sync.Mutex
	table   map[string]*Member
	leaving map[string]bool // peers that sent msgLeaving; only names in table
	// resending: names whose forget notice is being sent again; closing:
	// Close has begun.
	resending map[string]bool
	closing   bool
	// fenced is written under mu and read without it (Fenced is asked
	// on every raft tick of every partition of the node).
	fenced  atomic.Bool
	pending map[string]*Event
	order   []string // pending keys, oldest first
	stats   Stats
	rrNext  int
	known   []string // SetKnownPeers

	// Load reports (load.go): loadSource samples this node's load;
	// loads keeps each alive peer's last report, localLoad this node's.
	loadSource   atomic.Pointer[func() Load]
	loadInterval time.Duration
	now          func() time.Time
	loads        map[string]peerLoad
	localLoad    Load
	loadSeq      uint64
}

// New starts a node's membership and joins cfg.Seeds (failing to reach any
// seed is not an error: JoinErr says why, and the reconnect loop keeps
// trying, see Config.Seeds).
func New(cfg Config) (*Membership, error) {
	if cfg.Profile == (Profile{}) {
		cfg.Profile = SeedProfile()
	}
	if err := cfg.Profile.Validate(); err != nil {
		return nil, err
	}
	if cfg.Meta.NodeID == "" {
		return nil, fmt.Errorf("%w: empty node id", ErrBadConfig)
	}
	if cfg.LoadInterval < 0 {
		return nil, fmt.Errorf("%w: negative load interval", ErrBadConfig)
	}
	if cfg.LoadInterval == 0 {
		cfg.LoadInterval = LoadIntervalDefault
	}
	if n := len(cfg.SecretKey); n != 0 && n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("%w: a gossip key of %d bytes, not 16, 24 or 32", ErrBadConfig, n)
	}
	meta, err := cfg.Meta.encode()
	if err != nil {
		return nil, err
	}
	m := &Membership{
		self:      cfg.Meta.NodeID,
		selfMeta:  cfg.Meta,
		profile:   cfg.Profile,
		seeds:     append([]string(nil), cfg.Seeds...),
		kick:      make(chan struct{}, 1),
		nudge:     make(chan struct{}, 1),
		out:       make(chan Event),
		stop:      make(chan struct{}),
		table:     map[string]*Member{},
		leaving:   map[string]bool{},
		resending: map[string]bool{},
		pending:   map[string]*Event{},

		loadInterval: cfg.LoadInterval,
		now:          time.Now,
		loads:        map[string]peerLoad{},
	}
	m.meta = newMetaDelegate(meta)
	mc := cfg.memberlistConfig(m.meta, m)
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("membership: start memberlist: %w", err)
	}
	m.ml = ml
	m.selfAddr = m.Addr()
	m.started = time.Now()
	if len(m.seeds) > 0 {
		// Best effort: a node may start before its seeds (the reconnect
		// loop keeps trying). The error says why none answered: not
		// there yet, or another gossip key.
		if n, err := ml.Join(m.seeds); n == 0 {
			m.joinErr = err
		}
	}
	m.wg.Add(3)
	go m.pump()
	go m.reconnect()
	go m.loadLoop()
	return m, nil
}

// memberlistConfig maps cfg (with a validated Profile) onto memberlist's
// configuration.
func (cfg Config) memberlistConfig(md *metaDelegate, m *Membership) *memberlist.Config {
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Meta.NodeID
	mc.BindAddr = cfg.BindAddr
	if mc.BindAddr == "" {
		mc.BindAddr = "127.0.0.1"
	}
	mc.BindPort = cfg.BindPort
	mc.AdvertisePort = cfg.BindPort
	mc.Transport = cfg.Transport
	p := cfg.Profile
	mc.ProbeTimeout = p.ProbeTimeout
	mc.ProbeInterval = p.ProbeInterval
	mc.IndirectChecks = p.IndirectChecks
	mc.SuspicionMult = p.SuspicionMult
	mc.SuspicionMaxTimeoutMult = 1
	// Lifeguard's awareness stretches the probe interval of a node that
	// thinks itself slow. It is off so that WorstCaseDetection holds.
	mc.AwarenessMaxMultiplier = 1
	mc.TCPTimeout = max(2*p.ProbeInterval, time.Second)
	mc.SecretKey = cfg.SecretKey
	// A node's id belongs to its data directory, which may come back on
	// another address (a restart on a new port, a directory moved to
	// another host): a dead node's id may be taken by a new address as
	// soon as it is declared dead (a live node's never is). A later
	// reclaim time would refuse the restarted node's first alive
	// messages, and nothing would repeat them before the next full state
	// exchange (PushPullInterval, 30 s).
	mc.DeadNodeReclaimTime = time.Nanosecond
	mc.Delegate = &delegate{meta: md, m: m}
	mc.Conflict = (*conflicts)(m)
	mc.Events = (*events)(m)
	if cfg.Logger != nil {
		mc.Logger = cfg.Logger
	} else {
		mc.LogOutput = io.Discard
	}
	return mc
}

// Addr is this node's gossip address, for other nodes' seeds.
func (m *Membership) Addr() string {
	n := m.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// SetKnownPeers sets the gossip addresses ("host:port") of other nodes
// this node knows of besides its seeds (sinew serve: the nodes of its
// committed node table), replacing the previous ones. They are joined as
// the seeds are: each ReconnectInterval while this node sees no peer
// alive, while it is fenced, and for a while after start. A list that
// brings an address not held before starts a reconnect round at once, so
// a node restarted without seeds need not wait a whole interval. This
// node's own address and duplicates are dropped; at most knownPeersMax
// addresses are kept.
func (m *Membership) SetKnownPeers(addrs []string) {
	known := make([]string, 0, min(len(addrs), knownPeersMax))
	seen := map[string]bool{}
	for _, a := range addrs {
		if len(known) == knownPeersMax {
			break
		}
		if a != "" && a != m.selfAddr && !seen[a] {
			seen[a] = true
			known = append(known, a)
		}
	}
	m.mu.Lock()
	for _, a := range m.known {
		delete(seen, a)
	}
	fresh := len(seen) > 0
	m.known = known
	m.mu.Unlock()
	if fresh {
		select {
		case m.nudge <- struct{}{}:
		default:
		}
	}
}

// JoinErr is why no seed could be joined at start (nil if one was, or if
// there were no seeds). The node keeps trying in the background.
func (m *Membership) JoinErr() error { return m.joinErr }

// Events delivers transitions, the latest per node (see Event.Coalesced).
// It is closed after Close.
func (m *Membership) Events() <-chan Event { return m.out }

// Fenced reports whether this node sees a majority of its peers dead.
func (m *Membership) Fenced() bool { return m.fenced.Load() }

// Members returns the peers in the view (not this node), dead and left
// ones included.
func (m *Membership) Members() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Member, 0, len(m.table))
	for _, p := range m.table {
		out = append(out, *p)
	}
	return out
}

// Stats returns the view's counters.
func (m *Membership) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

// Leave tells the other nodes this one is leaving, waiting at most
// timeout for the message to spread; they see EventLeave, not EventDead.
// Close afterwards.
func (m *Membership) Leave(timeout time.Duration) error {
	leaving := m.selfMeta
	leaving.Leaving = true
	b, err := leaving.encode()
	if err != nil {
		return err
	}
	m.meta.b.Store(&b)
	// Spread the Leaving flag before the leave itself, so that peers
	// record EventLeave rather than EventDead: in the metadata, by gossip,
	// and to every member directly over TCP, because gossip may bring the
	// leave before the metadata.
	if err := m.ml.UpdateNode(timeout); err != nil {
		return fmt.Errorf("membership: announce leaving: %w", err)
	}
	notice := append([]byte{msgLeaving}, m.self...)
	for _, to := range m.alivePeers() {
		_ = m.ml.SendReliable(to, notice) // a peer that misses it sees a crash
	}
	return m.ml.Leave(timeout)
}

// alivePeers is every peer alive in this node's view, addressed for a
// direct message.
func (m *Membership) alivePeers() []*memberlist.Node {
	var out []*memberlist.Node
	for _, p := range m.Members() {
		if p.State != StateAlive {
			continue
		}
		host, port, err := net.SplitHostPort(p.Addr)
		pn, perr := strconv.ParseUint(port, 10, 16)
		if err != nil || perr != nil {
			continue
		}
		out = append(out, &memberlist.Node{Name: p.Name, Addr: net.ParseIP(host), Port: uint16(pn)})
	}
	return out
}

// startRejoinFor is how long after start a node keeps joining its seeds
// although it has peers: twice the time its peers may take to declare
// its previous run dead (a probe round over reconnectPeersMax nodes, then
// the worst-case detection).
func (m *Membership) startRejoinFor() time.Duration {
	p := m.profile
	return 2 * (time.Duration(reconnectPeersMax)*p.ProbeInterval + p.WorstCaseDetection(reconnectPeersMax))
}

// ErrNotDead refuses Forget for a node alive in the view; ErrUnknownNode
// for a name the view does not hold.
var (
	ErrNotDead     = errors.New("membership: the node is alive in this view")
	ErrUnknownNode = errors.New("membership: no such node in this view")
)

// Forget records a dead peer as left, here and, by a message to every
// alive peer, in their views: a node that will not come back (a machine
// retired without a leave) then no longer counts against the majority
// that fencing needs. A forgotten node that comes back is alive again.
func (m *Membership) Forget(name string) error {
	m.mu.Lock()
	p, ok := m.table[name]
	switch {
	case !ok:
		m.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownNode, name)
	case p.State == StateAlive:
		m.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrNotDead, name)
	}
	m.setLocked(name, StateLeft, p.Addr, p.Meta, p.MetaErr)
	m.fenceLocked()
	n := len(m.table) + 1
	// One resender per name, none once closing.
	resend := !m.closing && !m.resending[name]
	if resend {
		m.resending[name] = true
		m.wg.Add(1)
	}
	m.mu.Unlock()
	notice := append([]byte{msgForget}, name...)
	m.sendAlive(notice)
	if !resend {
		return nil
	}
	// A peer that still holds the node alive ignores the notice; it is
	// sent again each probe interval until every peer has had time to
	// declare the node dead (bounded, and stopped by Close).
	resendFor := 2 * (time.Duration(n)*m.profile.ProbeInterval + m.profile.WorstCaseDetection(n))
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			delete(m.resending, name)
			m.mu.Unlock()
		}()
		t := time.NewTicker(m.profile.ProbeInterval)
		defer t.Stop()
		end := time.After(resendFor)
		for {
			select {
			case <-m.stop:
				return
			case <-end:
				return
			case <-t.C:
				m.sendAlive(notice)
			}
		}
	}()
	return nil
}

// conflicts is the memberlist.ConflictDelegate: it reports another
// process announcing this node's own id (two processes on copies of one
// data directory). Conflicts over other names are memberlist's to log.
type conflicts Membership

func (c *conflicts) NotifyConflict(existing, other *memberlist.Node) {
	m := (*Membership)(c)
	if existing.Name != m.self {
		return
	}
	meta, merr := decodeMeta(other.Meta)
	m.mu.Lock()
	defer m.mu.Unlock()
	// Keyed apart from this node's fence events (a name never holds a
	// NUL byte), one pending at a time.
	m.queueKeyLocked(m.self+"\x00conflict", Event{Kind: EventIDConflict, Node: m.self, Meta: meta, MetaErr: merr, Addr: other.Address()})
}

// sendAlive sends msg to every peer alive in the view, best effort.
func (m *Membership) sendAlive(msg []byte) {
	for _, q := range m.Members() {
		if q.State != StateAlive {
			continue
		}
		host, port, err := net.SplitHostPort(q.Addr)
		pn, perr := strconv.ParseUint(port, 10, 16)
		if err != nil || perr != nil {
			continue
		}
		to := &memberlist.Node{Name: q.Name, Addr: net.ParseIP(host), Port: uint16(pn)}
		_ = m.ml.SendReliable(to, msg) // a peer that misses it gets the next one
	}
}

// Close stops gossip without a leave message (to the others it is a
// crash, unless Leave came first), stops the view's goroutines and closes
// Events.
func (m *Membership) Close() error {
	var err error
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closing = true // no new goroutine joins wg after this
		m.mu.Unlock()
		close(m.stop)
		err = m.ml.Shutdown()
		m.wg.Wait()
	})
	return err
}

// setLocked records a peer's state and queues the transition, if any.
func (m *Membership) setLocked(name string, s State, addr string, meta Meta, merr error) {
	p, ok := m.table[name]
	if !ok {
		p = &Member{Name: name}
		m.table[name] = p
	}
	old := p.State
	p.State, p.Addr, p.Meta, p.MetaErr = s, addr, meta, merr
	if old == s {
		return
	}
	if s != StateAlive {
		m.dropLoadLocked(name)
	}
	var k EventKind
	switch s {
	case StateDead:
		k = EventDead
	case StateLeft:
		k = EventLeave
	default: // new, or back from dead or left
		k = EventJoin
	}
	m.stats.Transitions++
	m.queueLocked(Event{Kind: k, Node: name, Meta: meta, MetaErr: merr})
}

// fenceLocked applies the seed's rule: fenced while more than half of the
// peers that have not left are unreachable, here: dead.
func (m *Membership) fenceLocked() {
	peers, bad := 0, 0
	for _, p := range m.table {
		switch p.State {
		case StateLeft:
			continue
		case StateDead:
			bad++
		}
		peers++
	}
	f := bad*2 > peers
	if f == m.fenced.Load() {
		return
	}
	m.fenced.Store(f)
	k := EventUnfenced
	if f {
		k = EventFenced
	}
	m.queueLocked(Event{Kind: k, Node: m.self})
}

// queueLocked makes ev the pending event of its node. At most one event
// per node (and one for this node's fence) waits, so memory is bounded by
// the cluster size and no node's latest state is ever dropped.
func (m *Membership) queueLocked(ev Event) { m.queueKeyLocked(ev.Node, ev) }

// queueKeyLocked is queueLocked with the pending slot named by key.
func (m *Membership) queueKeyLocked(key string, ev Event) {
	if p, ok := m.pending[key]; ok {
		ev.Coalesced = p.Coalesced + 1
		*p = ev
		m.stats.Coalesced++
		return
	}
	m.pending[key] = &ev
	m.order = append(m.order, key)
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// pump hands pending events to the reader, oldest node first.
func (m *Membership) pump() {
	defer m.wg.Done()
	defer close(m.out)
	for {
		m.mu.Lock()
		var ev Event
		have := len(m.order) > 0
		if have {
			key := m.order[0]
			m.order = m.order[1:]
			ev = *m.pending[key]
			delete(m.pending, key)
		}
		m.mu.Unlock()
		if !have {
			select {
			case <-m.stop:
				return
			case <-m.kick:
				continue
			}
		}
		select {
		case <-m.stop:
			return
		case m.out <- ev:
		}
	}
}

// reconnect rejoins peers held dead, and the seeds and known peers while
// alone, fenced or newly started (reconnectTargets). memberlist
// stops probing a dead node, so after a partition heals each side would
// otherwise go on holding the other dead; a join exchanges full state, and
// each side then refutes the other's verdict on itself.
func (m *Membership) reconnect() {
	defer m.wg.Done()
	t := time.NewTicker(m.profile.ReconnectInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		case <-m.nudge:
		}
		addrs := m.reconnectTargets()
		if len(addrs) == 0 {
			continue
		}
		m.mu.Lock()
		m.stats.ReconnectAttempts += uint64(len(addrs))
		m.mu.Unlock()
		_, _ = m.ml.Join(addrs) // failures are expected while the peers are gone
	}
}

func (m *Membership) reconnectTargets() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var dead []string
	seen := map[string]bool{}
	add := func(a string) {
		if a != "" && !seen[a] {
			seen[a] = true
			dead = append(dead, a)
		}
	}
	for _, p := range m.table {
		if p.State == StateDead {
			add(p.Addr)
		}
	}
	// The seeds and the known peers too while fenced, while no peer is
	// alive (the seeds were not up when this node started; a node started
	// without seeds learns its peers from SetKnownPeers), and for a while
	// after start: peers that still held this node's previous run as
	// alive (at another address, or at this one: a run that answers the
	// old one's probes is never declared dead, and the peers would not
	// tell it of each other) refused or missed its first messages, and a
	// join hands them the new run.
	alone := true
	for _, p := range m.table {
		alone = alone && p.State != StateAlive
	}
	if m.fenced.Load() || alone || time.Since(m.started) < m.startRejoinFor() {
		for _, a := range m.seeds {
			add(a)
		}
		for _, a := range m.known {
			add(a)
		}
	}
	if len(dead) <= reconnectPeersMax {
		return dead
	}
	// Rotate through a long list, a bounded slice per round.
	out := make([]string, 0, reconnectPeersMax)
	for i := range reconnectPeersMax {
		out = append(out, dead[(m.rrNext+i)%len(dead)])
	}
	m.rrNext = (m.rrNext + reconnectPeersMax) % len(dead)
	return out
}

// events is the memberlist.EventDelegate. memberlist calls it with its own
// node lock held, which is also the only time a *memberlist.Node may be
// read (memberlist updates them in place under that lock), so the view is
// updated here, under mu, without calling back into memberlist.
type events Membership

func (e *events) NotifyJoin(n *memberlist.Node) { (*Membership)(e).observe(n, StateAlive) }

func (e *events) NotifyUpdate(n *memberlist.Node) { (*Membership)(e).observe(n, StateAlive) }

func (e *events) NotifyLeave(n *memberlist.Node) {
	m := (*Membership)(e)
	// memberlist reports a leave and a crash alike (Node.State is not
	// kept up to date); a node that leaves through Leave says so first.
	s := StateDead
	if meta, err := decodeMeta(n.Meta); err == nil && meta.Leaving {
		s = StateLeft
	}
	m.mu.Lock()
	if m.leaving[n.Name] {
		s = StateLeft
	}
	m.mu.Unlock()
	m.observe(n, s)
}

func (m *Membership) observe(n *memberlist.Node, s State) {
	if n.Name == m.self {
		return
	}
	meta, merr := decodeMeta(n.Meta)
	addr := n.Address()
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.leaving, n.Name)
	m.setLocked(n.Name, s, addr, meta, merr)
	m.fenceLocked()
}

// metaDelegate serves this node's metadata and nothing else.
type metaDelegate struct{ b atomic.Pointer[[]byte] }

func newMetaDelegate(b []byte) *metaDelegate {
	d := &metaDelegate{}
	d.b.Store(&b)
	return d
}

func (d *metaDelegate) NodeMeta(limit int) []byte {
	b := *d.b.Load()
	if len(b) > limit {
		return nil // encode checked metaBytesMax; memberlist's limit is the same
	}
	return b
}

// msgLeaving starts the user message a node sends each peer from Leave;
// the rest is its name.
const msgLeaving = 'L'

// msgForget starts the user message Forget sends each alive peer; the
// forgotten node's name follows.
const msgForget = 'F'

// delegate is the memberlist.Delegate: it serves this node's metadata and
// takes leave notices. Any other user message is ignored.
type delegate struct {
	meta *metaDelegate
	m    *Membership
}

func (d *delegate) NodeMeta(limit int) []byte { return d.meta.NodeMeta(limit) }

func (d *delegate) NotifyMsg(b []byte) {
	if len(b) < 2 {
		return
	}
	if b[0] == msgLoad {
		d.m.takeLoad(b)
		return
	}
	name := string(b[1:])
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	// Only names already in the view, so a peer cannot grow the map.
	p, ok := d.m.table[name]
	if !ok {
		return
	}
	switch b[0] {
	case msgLeaving:
		d.m.leaving[name] = true
	case msgForget:
		// Only a node this view holds dead: one alive here answers
		// this node's probes, whatever the sender thinks of it. Forget
		// sends again for a while, so a node that has not noticed the
		// death yet applies it once it does.
		if p.State == StateDead {
			d.m.setLocked(name, StateLeft, p.Addr, p.Meta, p.MetaErr)
			d.m.fenceLocked()
		}
	}
}

func (*delegate) GetBroadcasts(int, int) [][]byte { return nil }
func (*delegate) LocalState(bool) []byte          { return nil }
func (*delegate) MergeRemoteState([]byte, bool)   {}
