package broker

import (
	"context"
	"slices"
)

// Steps of one partition in a replica move, as a replica of its queue
// sees the group's configuration (MoveSteps).
const (
	// MoveStepAdding: the target is not in the group yet (its owner adds
	// it as a learner next).
	MoveStepAdding = "adding"
	// MoveStepCatchingUp: the target is a learner receiving the log.
	MoveStepCatchingUp = "catching_up"
	// MoveStepCaughtUp: the target votes; the queue's other partitions,
	// or the owner's report, are awaited before the cut-over.
	MoveStepCaughtUp = "caught_up"
	// MoveStepTransferring: cut over; the source still leads and hands
	// its lead to a caught-up wanted voter.
	MoveStepTransferring = "transferring"
	// MoveStepRemoving: cut over; the source is being removed from the
	// group.
	MoveStepRemoving = "removing"
	// MoveStepInPlace: the group votes without the source.
	MoveStepInPlace = "in_place"
)

// MoveStep is one partition's step in a replica move as this node sees it.
type MoveStep struct {
	Partition int
	// Step is one of the MoveStep* steps.
	Step string
	// Owner is the client address of the partition's raft leader ("":
	// none known).
	Owner string
	// Progress is set when this node leads the partition and so knows how
	// far the target's log matches its own (Match) against its commit
	// index (Commit).
	Progress      bool
	Match, Commit uint64
}

// MoveSteps reports each partition's step in moving queue topic/group's
// replica from node from to node to (raft ids), from the group
// configurations this node's replicas applied; cutOver is whether the
// catalogue has cut the move over. It returns nil when this node holds no
// replica of the queue (the queue's replicas know the steps).
func (b *Broker) MoveSteps(ctx context.Context, topic, group string, from, to uint64, cutOver bool) []MoveStep {
	if b.cfg.Cluster == nil {
		return nil
	}
	b.mu.RLock()
	q := b.queues[queueKey{topic, group}]
	b.mu.RUnlock()
	if q == nil {
		return nil
	}
	out := make([]MoveStep, 0, len(q.parts))
	for i, p := range q.parts {
		voters, learners := p.RaftConf()
		lead, _ := p.Leader()
		s := MoveStep{Partition: i}
		s.Owner, _ = b.partitionOwner(p)
		switch {
		case !cutOver && slices.Contains(learners, to):
			s.Step = MoveStepCatchingUp
		case !cutOver && slices.Contains(voters, to):
			s.Step = MoveStepCaughtUp
		case !cutOver:
			s.Step = MoveStepAdding
		case slices.Contains(voters, from) && lead == from:
			s.Step = MoveStepTransferring
		case slices.Contains(voters, from) || slices.Contains(learners, from):
			s.Step = MoveStepRemoving
		default:
			s.Step = MoveStepInPlace
		}
		if (s.Step == MoveStepCatchingUp || s.Step == MoveStepAdding) && lead == b.cfg.Cluster.Self() {
			if match, commit, ok, err := p.ReplicaProgress(ctx, to); err == nil && ok {
				s.Progress, s.Match, s.Commit = true, match, commit
			}
		}
		out = append(out, s)
	}
	return out
}
