package partition

import "context"

// ReplicaProgress reports, on the replica that leads the group, how far
// replica id's log matches the leader's (match) and the leader's commit
// index; ok is false on a replica that does not lead, or whose group does
// not hold id. A replica move's catch-up shows through it (the owner adds
// the new replica as a learner and promotes it once match reaches commit).
func (p *Partition) ReplicaProgress(ctx context.Context, id uint64) (match, commit uint64, ok bool, err error) {
	if err := p.Unavailable(); err != nil {
		return 0, 0, false, err
	}
	_, err = p.leaderStep(ctx, func() (string, error) {
		if !p.leads || p.single {
			return "", nil
		}
		st := p.rn.Status()
		if pr, found := st.Progress[id]; found {
			match, commit, ok = pr.Match, st.Commit, true
		}
		return "", nil
	})
	if err != nil {
		return 0, 0, false, err
	}
	return match, commit, ok, nil
}
