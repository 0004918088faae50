package queue

import "slices"

// Leases lists every current lease, whatever its owner, by offset. It walks
// the lease index, so it costs O(inflight messages); the partition calls it
// once after recovery to find leases whose holders did not survive the
// restart.
func (s *State) Leases() []Info {
	var out []Info
	for _, it := range s.leases.a {
		if e, ok := s.live(it, phaseInflight); ok {
			out = append(out, s.info(it.off, e))
		}
	}
	slices.SortFunc(out, func(a, b Info) int { return cmpU64(a.Offset, b.Offset) })
	return out
}
