package server

import (
	"cmp"
	"slices"
	"time"
)

// ConnView is a snapshot of one open client connection for operators.
type ConnView struct {
	ConnID     uint64
	RemoteAddr string
	OpenedAt   time.Time
	// Established is set once the handshake succeeded (HELLO_OK queued).
	Established bool
}

// Connections lists the open client connections, by connection id. The
// session attached to a connection is found through Registry().Sessions,
// whose views carry the connection id.
func (s *Server) Connections() []ConnView {
	s.mu.Lock()
	out := make([]ConnView, 0, len(s.conns))
	for c := range s.conns {
		out = append(out, ConnView{ConnID: c.id, RemoteAddr: remoteAddr(c.nc), OpenedAt: c.opened, Established: c.established.Load()})
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b ConnView) int { return cmp.Compare(a.ConnID, b.ConnID) })
	return out
}

// Draining reports whether Shutdown has begun.
func (s *Server) Draining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}
