package partition

import (
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/queue"
)

// Counters counts what the partitions of one broker did since it started.
// One Counters is shared by every partition of a broker (Config.Counters),
// so the totals do not go down when a queue is deleted. Fields are written
// by partition actors with atomic adds and read by anyone at any time.
type Counters struct {
	// Appended counts Enqueue records appended: publishes and dead-letter
	// copies taken in (each is confirmed once its stage is durable).
	Appended atomic.Uint64
	// Deliveries counts leases handed to consumers; Redeliveries those of
	// them whose attempt is above one.
	Deliveries, Redeliveries atomic.Uint64
	// Acks counts completed leases.
	Acks atomic.Uint64
	// Nacks, LeaseExpiries and Released count requeues by reason.
	Nacks, LeaseExpiries, Released atomic.Uint64
	// Fails counts messages a consumer declared unprocessable.
	Fails atomic.Uint64
	// DeadLettered counts messages that failed for good, by reason
	// (queue.ReasonFailed, ReasonRetriesExhausted, ReasonExpired);
	// Purged counts messages an operator removed (Purge, Discard), apart.
	DeadLettered [deadReasonSlots]atomic.Uint64
	Purged       atomic.Uint64
	// Extensions counts lease deadlines moved by their holder (EXTEND).
	Extensions atomic.Uint64
}

// deadReasonSlots is one past the largest queue.Reason.
const deadReasonSlots = int(queue.ReasonPurged) + 1

// DeadLetterReasons are the reasons DeadLettered counts, in a stable order.
var DeadLetterReasons = []queue.Reason{queue.ReasonFailed, queue.ReasonRetriesExhausted, queue.ReasonExpired}

// DeadLetteredBy returns the count of messages dead-lettered for r.
func (c *Counters) DeadLetteredBy(r queue.Reason) uint64 {
	if int(r) >= deadReasonSlots {
		return 0
	}
	return c.DeadLettered[r].Load()
}

// count records one applied event.
func (c *Counters) count(ev *queue.Event) {
	switch ev.Kind {
	case queue.KindEnqueue:
		c.Appended.Add(1)
	case queue.KindLease:
		c.Deliveries.Add(1)
		if ev.Attempt > 1 {
			c.Redeliveries.Add(1)
		}
	case queue.KindAck:
		c.Acks.Add(1)
	case queue.KindExtend:
		c.Extensions.Add(1)
	case queue.KindRequeue:
		switch ev.Reason {
		case queue.ReasonNack:
			c.Nacks.Add(1)
		case queue.ReasonLeaseExpired:
			c.LeaseExpiries.Add(1)
		case queue.ReasonReleased:
			c.Released.Add(1)
		}
	case queue.KindDeadLetter:
		switch {
		case ev.Reason == queue.ReasonPurged:
			c.Purged.Add(1)
		default:
			if ev.Reason == queue.ReasonFailed {
				c.Fails.Add(1)
			}
			if int(ev.Reason) < deadReasonSlots {
				c.DeadLettered[ev.Reason].Add(1)
			}
		}
	}
}

// SyncObserver is told of every sync (or flush, under SyncInterval) that
// made a stage durable: how many records it covered and how long it took.
// It runs on the partition's syncer goroutine and must not block.
type SyncObserver func(records int, took time.Duration)

// observeSync times persist for the SyncObserver, if any.
func (p *Partition) observeSync(records int, start time.Time) {
	if p.cfg.OnSync != nil {
		p.cfg.OnSync(records, time.Since(start))
	}
}
