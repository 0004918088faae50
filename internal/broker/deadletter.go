package broker

import (
	"sync"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/protocol"
)

// Dead-letter queues keep what they hold.
//
// A dead-letter queue is the last place a failed message goes, so it never
// dead-letters or discards anything itself: a message leaves it only when a
// consumer completes it (or an operator purges the queue). In the queue
// state machine this is queue.DeadLetterPolicy.Keep: no retry limit, no TTL,
// and FAIL puts the message back to ready at once, as a NACK without delay
// would. A queue keeps when any of these holds:
//
//	rule                                             why
//	-----------------------------------------------  -------------------------------------------
//	it is the global dead-letter queue               by name (Config.DeadLetterTopic, group ""),
//	                                                 whoever created it: also one created by an
//	                                                 older broker with max_retries 5
//	it was created as a dead-letter target           meta dead_letter_queue: the first dead
//	                                                 letter to a named target created it
//	its stored dead-letter policy points into itself metadata written before such declarations
//	                                                 were refused; it used to discard
//
// A declaration whose dead-letter policy points into the queue itself is
// refused with bad_request (refuseSelfDeadLetter). The global dead-letter
// queue may be declared with the default mode, which for it means "keep".
// A named target that already existed when the first message was
// dead-lettered to it keeps its own settings; its failures go on to its own
// dead-letter policy (by default the global dead-letter queue, which keeps).

// keepReason says why the queue described by m keeps every message, or ""
// when it does not.
func (b *Broker) keepReason(m *queueMeta) string {
	switch {
	case m.Group == "" && m.Topic == b.cfg.DeadLetterTopic:
		return "global dead-letter queue"
	case m.DeadLetterQueue:
		return "created as a dead-letter queue"
	case m.Group == "" && m.Topic == b.resolvedDeadLetterTopic(m):
		return "its dead-letter policy points into itself"
	}
	return ""
}

// resolvedDeadLetterTopic is the topic m's dead-letter policy names, before
// any keep rule: "" for discard.
func (b *Broker) resolvedDeadLetterTopic(m *queueMeta) string {
	switch m.DeadLetterMode {
	case protocol.DeadLetterDiscard:
		return ""
	case protocol.DeadLetterQueue:
		return m.DeadLetterTarget
	}
	return b.cfg.DeadLetterTopic
}

// refuseSelfDeadLetter refuses a declaration whose dead-letter policy points
// into the declared queue itself: failed messages would be copied into the
// queue they failed in, or, as before, silently discarded.
func (b *Broker) refuseSelfDeadLetter(d *protocol.DeclareQueue) error {
	if d.Group != "" {
		return nil // targets are default groups, never this queue
	}
	switch {
	case d.DeadLetterMode == protocol.DeadLetterQueue && d.DeadLetterTarget == d.Topic:
		return protocol.Errorf(protocol.CodeBadRequest,
			"dead_letter_target %q is the queue itself: a queue cannot dead-letter into itself", d.DeadLetterTarget)
	case d.DeadLetterMode == protocol.DeadLetterGlobal && d.Topic == b.cfg.DeadLetterTopic:
		return protocol.Errorf(protocol.CodeBadRequest,
			"queue %q is the global dead-letter queue: it cannot dead-letter into itself (it keeps every message)", d.Topic)
	}
	return nil
}

// logKeep tells the operator, when a queue is opened, that it keeps every
// message, and warns when that comes from metadata that points into itself.
func (b *Broker) logKeep(m *queueMeta) {
	switch why := b.keepReason(m); why {
	case "":
	case "its dead-letter policy points into itself":
		b.logger.Warn("queue's dead-letter policy points into itself; it keeps every message instead of discarding: retries unlimited, no TTL, FAIL requeues",
			"topic", m.Topic, "group", m.Group)
	default:
		b.logger.Info("dead-letter queue keeps every message until completed or purged: retries unlimited, no TTL, FAIL requeues",
			"topic", m.Topic, "group", m.Group, "why", why)
	}
}

// deadLetterQueue finds the queue a dead letter goes to, creating it on
// first use as a dead-letter queue (flagged in its metadata, so it keeps).
func (b *Broker) deadLetterQueue(topic string) (*queueEntry, error) {
	b.mu.RLock()
	q := b.queues[queueKey{topic, ""}]
	b.mu.RUnlock()
	if q != nil {
		return q, nil
	}
	if b.testCreateHook != nil {
		b.testCreateHook(topic) // tests: a creation that takes its time
	}
	q, _, err := b.declareQueue(&protocol.DeclareQueue{Topic: topic, MaxRetries: -1}, false, true, nil)
	return q, err
}

// keepConfig turns qc into the configuration of a queue that keeps.
func keepConfig(qc queue.Config) queue.Config {
	qc.DeadLetter = queue.DeadLetterPolicy{Keep: true}
	return qc
}

// Dead-letter copies leave the partition goroutine.
//
// A partition hands each dead-letter copy to Broker.deadLetter, on its own
// goroutine, which must not block (partition.Config.DeadLetter). The first
// copy to a target may have to create the target queue: files and fsyncs on
// a single node, a commit through the controller's consensus in a cluster
// (up to clusterCreateTimeout). So deadLetter only queues the copy for one
// worker goroutine per broker, which creates the target when it is missing
// and publishes the copy; the target partition confirms it (durable) by
// calling the source partition's done.
//
//	source partition goroutine      dead-letter worker (one per broker)     target partition
//	--------------------------      -----------------------------------     ----------------
//	DeadLetter event durable
//	deadLetter(target, copy, done)
//	  jobs full or closed:
//	    done(err) at once     ----> (nothing queued)
//	  else queued, returns    ----> find or create target queue
//	                                  error: done(err)
//	                                Publish(copy)                      ---> append, fsync
//	ctlDeadLettered           <---------------------------------------- done(nil | err)
//	  nil: DeadLetterDone recorded, the source forgets the message
//	  err: the message stays dead-lettering, retried after deadLetterRetryMs
//
// Nothing is dropped: until done(nil) the message stays in the source
// partition's dead-lettering state, durable in its log, and is copied
// again after an error, a full queue or a restart (a copy may so be made
// twice, never lost). The worker takes jobs in order; a creation under way
// holds up the copies behind it, not the partitions that made them.

// deadLetterJobsMax bounds the copies waiting for the worker, for the
// whole broker. A partition has at most 256 copies outstanding; past this
// bound deadLetter refuses with errDeadLetterBusy and the partition tries
// again later.
const deadLetterJobsMax = 4096

// errDeadLetterBusy answers a copy the worker has no room for.
var errDeadLetterBusy = protocol.Errorf(protocol.CodeUnavailable, "dead-letter queue of work is full; the copy is retried")

type deadLetterJob struct {
	target string
	m      *queue.Message
	done   func(error)
}

// deadLetterWorker is the broker's dead-letter goroutine and its bounded
// queue of jobs.
type deadLetterWorker struct {
	// mu orders enqueues against stop, so that no job is queued after the
	// worker drained the queue. It is held only for a non-blocking send.
	mu      sync.Mutex
	stopped bool
	jobs    chan deadLetterJob
	quit    chan struct{}
	// exited is closed when run returns (or when stop is called on a
	// worker that never ran).
	exited  chan struct{}
	started bool
}

func newDeadLetterWorker(jobsMax int) *deadLetterWorker {
	return &deadLetterWorker{
		jobs:   make(chan deadLetterJob, jobsMax),
		quit:   make(chan struct{}),
		exited: make(chan struct{}),
	}
}

// deadLetter is the partitions' dead-letter publisher
// (partition.Config.DeadLetter): it queues m for the default group of topic
// target and returns at once. done is called exactly once, from the worker
// or the target partition, or here when the copy is refused.
func (b *Broker) deadLetter(target string, m *queue.Message, done func(error)) {
	if !b.ready.Load() {
		done(ErrStarting)
		return
	}
	if err := b.dl.enqueue(deadLetterJob{target: target, m: m, done: done}); err != nil {
		done(err)
	}
}

// enqueue queues j without blocking.
func (w *deadLetterWorker) enqueue(j deadLetterJob) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return ErrShuttingDown
	}
	select {
	case w.jobs <- j:
		return nil
	default:
		return errDeadLetterBusy
	}
}

// start starts the worker goroutine (Open, once).
func (w *deadLetterWorker) start(b *Broker) {
	w.mu.Lock()
	w.started = true
	w.mu.Unlock()
	go w.run(b)
}

func (w *deadLetterWorker) run(b *Broker) {
	defer close(w.exited)
	for {
		select {
		case j := <-w.jobs:
			b.deadLetterCopy(j)
		case <-w.quit:
			// stop set stopped before closing quit: nothing more is
			// queued, so this drains the queue for good.
			for {
				select {
				case j := <-w.jobs:
					j.done(ErrShuttingDown)
				default:
					return
				}
			}
		}
	}
}

// stop refuses further jobs, answers the queued ones ErrShuttingDown and
// waits for the worker to return (after the job in hand, which is bounded
// by clusterCreateTimeout).
func (w *deadLetterWorker) stop() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopped = true
	started := w.started
	close(w.quit)
	w.mu.Unlock()
	if started {
		<-w.exited
		return
	}
	for {
		select {
		case j := <-w.jobs:
			j.done(ErrShuttingDown)
		default:
			return
		}
	}
}

// deadLetterCopy runs one job on the worker: it finds or creates the
// target queue and publishes the copy; the target partition calls done
// once the copy is durable (or failed).
func (b *Broker) deadLetterCopy(j deadLetterJob) {
	if b.closed.Load() {
		j.done(ErrShuttingDown)
		return
	}
	q, err := b.deadLetterQueue(j.target)
	if err != nil {
		j.done(err)
		return
	}
	p, err := q.pick(-1, j.m.Key, "", 0)
	if err != nil {
		j.done(err)
		return
	}
	p.Publish(j.m, func(_ uint64, err error) { j.done(err) })
}
