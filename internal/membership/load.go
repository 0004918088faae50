package membership

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Load is a node's load report: advisory numbers its peers use to prefer
// less loaded nodes (see the package doc, "Load reports"). A node sends
// its own every LoadInterval; none of them is ever a reason to fence,
// elect or refuse anything.
type Load struct {
	// Seq numbers the reports of one run of the node (Meta.Boot); a
	// report not newer than the last one kept from the same run is
	// dropped.
	Seq uint64
	// Boot is the sender's Meta.Boot.
	Boot uint64
	// PartitionsLed is the number of partitions the node leads (owns).
	PartitionsLed uint32
	// Backlog is the ready and in-flight messages of those partitions.
	Backlog uint64
	// AppendRate is the records the node appended per second over the
	// last interval (publishes it took in, and its replicas' appends).
	AppendRate uint32
}

// PeerLoad is the last report kept from a peer, with its age.
type PeerLoad struct {
	Load
	// Age is how long ago this node received it.
	Age time.Duration
}

// LoadIntervalDefault is how often a node sends its load report when
// Config.LoadInterval is zero.
const LoadIntervalDefault = 2 * time.Second

// loadStaleIntervals is how many intervals a report stays fresh: one
// older than that (about three lost reports in a row) is stale, and
// FreshLoads leaves it out.
const loadStaleIntervals = 3

// ErrBadLoad reports a load report a peer sent that does not decode.
var ErrBadLoad = errors.New("membership: bad load report")

// msgLoad starts the user message that carries a load report:
//
//	+-----+---------+--------+------+-----------+----------------+---------------+-----------------+------------------+
//	| 'R' | version | len u8 | name | Boot u64be | Seq uvarint | Led uvarint | Backlog uvarint | AppendRate uvarint |
//	+-----+---------+--------+------+-----------+----------------+---------------+-----------------+------------------+
//
// name is the sender's node id. A node of an older version ignores it
// (it only acts on msgLeaving and msgForget).
const (
	msgLoad        = 'R'
	loadVersion    = 1
	loadBytesMax   = 3 + fieldBytesMax + 8 + 4*binary.MaxVarintLen64
	loadNameOffset = 3
)

func encodeLoad(name string, l Load) ([]byte, error) {
	if len(name) == 0 || len(name) > fieldBytesMax {
		return nil, fmt.Errorf("%w: node id of %d bytes", ErrBadLoad, len(name))
	}
	b := make([]byte, 0, loadBytesMax)
	b = append(b, msgLoad, loadVersion, byte(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint64(b, l.Boot)
	b = binary.AppendUvarint(b, l.Seq)
	b = binary.AppendUvarint(b, uint64(l.PartitionsLed))
	b = binary.AppendUvarint(b, l.Backlog)
	b = binary.AppendUvarint(b, uint64(l.AppendRate))
	return b, nil
}

// decodeLoad reads a load report (the whole user message, msgLoad
// included). Whatever a peer sends, it returns an error and never panics.
func decodeLoad(b []byte) (string, Load, error) {
	if len(b) < loadNameOffset || b[0] != msgLoad {
		return "", Load{}, fmt.Errorf("%w: too short", ErrBadLoad)
	}
	if b[1] != loadVersion {
		return "", Load{}, fmt.Errorf("%w: version %d, want %d", ErrBadLoad, b[1], loadVersion)
	}
	n := int(b[2])
	b = b[loadNameOffset:]
	if n == 0 || n > fieldBytesMax || n > len(b) {
		return "", Load{}, fmt.Errorf("%w: node id truncated or too long", ErrBadLoad)
	}
	name := string(b[:n])
	b = b[n:]
	if len(b) < 8 {
		return "", Load{}, fmt.Errorf("%w: boot truncated", ErrBadLoad)
	}
	l := Load{Boot: binary.BigEndian.Uint64(b)}
	b = b[8:]
	var v [4]uint64
	for i := range v {
		x, k := binary.Uvarint(b)
		if k <= 0 {
			return "", Load{}, fmt.Errorf("%w: field %d truncated or overflowing", ErrBadLoad, i)
		}
		v[i], b = x, b[k:]
	}
	if len(b) != 0 {
		return "", Load{}, fmt.Errorf("%w: %d trailing bytes", ErrBadLoad, len(b))
	}
	if v[1] > 1<<32-1 || v[3] > 1<<32-1 {
		return "", Load{}, fmt.Errorf("%w: a 32-bit field out of range", ErrBadLoad)
	}
	l.Seq, l.PartitionsLed, l.Backlog, l.AppendRate = v[0], uint32(v[1]), v[2], uint32(v[3])
	return name, l, nil
}

// peerLoad is a report kept with the time it arrived.
type peerLoad struct {
	l  Load
	at time.Time
}

// SetLoadSource sets the function that samples this node's load. The
// report loop calls it every LoadInterval and sends the result to every
// peer alive in the view; it must be cheap. Nil stops the reports (the
// peers' copies then go stale).
func (m *Membership) SetLoadSource(f func() Load) {
	if f == nil {
		m.loadSource.Store(nil)
		return
	}
	m.loadSource.Store(&f)
}

// LocalLoad is this node's last report (ok false before the first).
func (m *Membership) LocalLoad() (Load, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.localLoad, m.localLoad.Seq != 0
}

// Loads returns the last report kept from each peer alive in the view,
// with its age, stale ones included (see FreshLoads).
func (m *Membership) Loads() map[string]PeerLoad {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]PeerLoad, len(m.loads))
	for name, pl := range m.loads {
		if p, ok := m.table[name]; ok && p.State == StateAlive {
			out[name] = PeerLoad{Load: pl.l, Age: max(now.Sub(pl.at), 0)}
		}
	}
	return out
}

// LoadStaleAfter is the age past which a peer's report is stale.
func (m *Membership) LoadStaleAfter() time.Duration {
	return loadStaleIntervals * m.loadInterval
}

// FreshLoads is Loads without the stale reports: what placement may use.
// A peer missing from it has no usable report.
func (m *Membership) FreshLoads() map[string]PeerLoad {
	out := m.Loads()
	for name, pl := range out {
		if pl.Age > m.LoadStaleAfter() {
			delete(out, name)
		}
	}
	return out
}

// takeLoad keeps a report a peer sent, when it names a peer alive in the
// view and is newer than the one kept (a new run of the node, or a higher
// sequence). Only names already in the view, so a peer cannot grow the
// map.
func (m *Membership) takeLoad(b []byte) {
	name, l, err := decodeLoad(b)
	if err != nil {
		m.mu.Lock()
		m.stats.BadLoads++
		m.mu.Unlock()
		return
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.table[name]
	if !ok || p.State != StateAlive || name == m.self {
		return
	}
	if old, ok := m.loads[name]; ok && old.l.Boot == l.Boot && l.Seq <= old.l.Seq {
		return
	}
	m.loads[name] = peerLoad{l: l, at: now}
}

// dropLoadLocked forgets a peer's report (it died or left).
func (m *Membership) dropLoadLocked(name string) { delete(m.loads, name) }

// reportLoad samples this node's load, keeps it as the local report and
// sends it to every peer alive in the view, best effort over UDP: a lost
// report is replaced by the next one.
func (m *Membership) reportLoad() {
	src := m.loadSource.Load()
	if src == nil {
		return
	}
	l := (*src)()
	m.mu.Lock()
	m.loadSeq++
	l.Seq, l.Boot = m.loadSeq, m.selfMeta.Boot
	m.localLoad = l
	m.mu.Unlock()
	msg, err := encodeLoad(m.self, l)
	if err != nil {
		return // New checked the id's length
	}
	for _, to := range m.alivePeers() {
		_ = m.ml.SendBestEffort(to, msg)
	}
}

// loadLoop sends this node's load report every loadInterval until Close.
func (m *Membership) loadLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.loadInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.reportLoad()
		}
	}
}
