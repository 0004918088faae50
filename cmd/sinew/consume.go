package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sinewmq/sinew"
)

func init() {
	commands["consume"] = command{
		summary: "print messages from a queue, acking each after printing (--peek: settle nothing)",
		run:     runConsume,
	}
}

// consumePrefetchMax bounds --prefetch: the largest limits.prefetch_max.
const consumePrefetchMax = 1 << 20

// consumePeekCountDefault is --count under --peek when none is given: a peek
// never settles, so it sees at most its prefetch and must stop somewhere.
const consumePeekCountDefault = 10

// consumePeekIdleExitDefault is --idle-exit under --peek when none is given,
// so a peek of a queue holding fewer than --count messages still ends.
const consumePeekIdleExitDefault = 2 * time.Second

// consumeJSON is one message of consume --json. Body and key are the bytes
// themselves when they are valid UTF-8, else base64; body_encoding and
// key_encoding say which ("utf8" or "base64").
type consumeJSON struct {
	Topic         string       `json:"topic"`
	Group         string       `json:"group,omitempty"`
	Partition     uint32       `json:"partition"`
	Offset        uint64       `json:"offset"`
	Attempt       uint32       `json:"attempt"`
	PublishedAtMs int64        `json:"published_at_ms"`
	Key           string       `json:"key,omitempty"`
	KeyEncoding   string       `json:"key_encoding,omitempty"`
	ContentType   string       `json:"content_type,omitempty"`
	Headers       []headerJSON `json:"headers,omitempty"`
	Body          string       `json:"body"`
	BodyEncoding  string       `json:"body_encoding"`
}

// headerJSON is one header, in the order the publisher gave them (a key may
// repeat). value_encoding is "base64" when the value is not valid UTF-8.
type headerJSON struct {
	Key           string `json:"key"`
	Value         string `json:"value"`
	ValueEncoding string `json:"value_encoding,omitempty"`
}

func messageJSON(m *sinew.Message) consumeJSON {
	j := consumeJSON{Topic: m.Topic, Group: m.Group, Partition: m.Partition, Offset: m.Offset, Attempt: m.Attempt,
		PublishedAtMs: m.PublishedAt.UnixMilli(), ContentType: m.ContentType}
	j.Body, j.BodyEncoding = jsonBytes(m.Body)
	if len(m.Key) > 0 {
		j.Key, j.KeyEncoding = jsonBytes(m.Key)
	}
	for _, h := range m.Headers {
		hj := headerJSON{Key: h.Key}
		var enc string
		if hj.Value, enc = jsonBytes([]byte(h.Value)); enc != encodingUTF8 {
			hj.ValueEncoding = enc
		}
		j.Headers = append(j.Headers, hj)
	}
	return j
}

// writePeekText prints one message for a person: a line with its position,
// then its key, content type and headers, then its body, each shown with
// displayBytes (escaped unless plain text) or as --body asks.
func writePeekText(w io.Writer, m *sinew.Message, bodyFormat string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "--- %s partition %d offset %d attempt %d published %s\n", displayBytes([]byte(m.Topic)),
		m.Partition, m.Offset, m.Attempt, m.PublishedAt.UTC().Format(time.RFC3339Nano))
	if len(m.Key) > 0 {
		fmt.Fprintf(&b, "key: %s\n", displayBytes(m.Key))
	}
	if m.ContentType != "" {
		fmt.Fprintf(&b, "content-type: %s\n", displayBytes([]byte(m.ContentType)))
	}
	for _, h := range m.Headers {
		fmt.Fprintf(&b, "header %s: %s\n", displayBytes([]byte(h.Key)), displayBytes([]byte(h.Value)))
	}
	fmt.Fprintf(&b, "body (%s): %s\n", nBytes(int64(len(m.Body))), displayBody(m.Body, bodyFormat))
	_, err := io.WriteString(w, b.String())
	return err
}

func runConsume(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("consume", stderr)
	cf := addClientFlags(fs)
	topic := fs.String("topic", "", "queue topic (required)")
	group := fs.String("group", "", "queue group")
	count := fs.Int("count", 0, "exit after this many messages (0 = no limit)")
	prefetch := fs.Int("prefetch", 64, "unsettled deliveries at once, 0 to 1048576 (0 = the broker's limits.prefetch_default; the broker clamps to its limits.prefetch_max)")
	autoAck := fs.Bool("auto-ack", false, "let the broker settle on delivery (a crash loses messages)")
	idleExit := fs.Duration("idle-exit", 0, "exit after this long with nothing arriving (0 = never)")
	asJSON := fs.Bool("json", false, `print one JSON object per message: topic, partition, offset, attempt, key, headers, body (see --help)`)
	peek := fs.Bool("peek", false, "show messages with their key and headers and settle none: they go back to the queue, no retry used (default --count 10, --idle-exit 2s)")
	bodyFormat := fs.String("body", "auto", "how --peek shows bodies: auto (text as it is, anything else escaped), escaped or base64")
	execCmd := fs.String("exec", "", "run this shell command (sh -c) once per message, the body on its stdin: exit 0 completes the message, any other exit retries it (default --prefetch 1)")
	cohortName := fs.String("cohort", "", "join this cohort (consumer group): its members share the queue's partitions, one member per partition, in order; assignments are reported on stderr")
	memberID := fs.String("member", "", "with --cohort: this consumer's member id (default: a random one)")
	extendEvery := fs.Duration("extend-every", 0, "with --exec: while the command runs, extend the message's lease every this long, each time to 3x this from now (0 = never; use a third of the queue's lease)")
	fs.Usage = func() {
		fmt.Fprint(stderr, consumeHelp)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case *topic == "":
		return fmt.Errorf("%w: --topic is required", errUsage)
	case *count < 0 || *idleExit < 0:
		return fmt.Errorf("%w: --count and --idle-exit must not be negative", errUsage)
	case *peek && *autoAck:
		return fmt.Errorf("%w: --peek settles nothing; --auto-ack would settle every delivery", errUsage)
	case *peek && set["prefetch"]:
		return fmt.Errorf("%w: --peek sets the prefetch to --count; drop --prefetch", errUsage)
	case !*peek && set["body"]:
		return fmt.Errorf("%w: --body is for --peek (consume prints bodies as they are, or in --json)", errUsage)
	case set["exec"] && strings.TrimSpace(*execCmd) == "":
		return fmt.Errorf("%w: --exec needs a command", errUsage)
	case *execCmd != "" && (*peek || *autoAck || *asJSON):
		return fmt.Errorf("%w: --exec settles each message by the command's exit status; it does not go with --peek, --auto-ack or --json", errUsage)
	case set["extend-every"] && *execCmd == "":
		return fmt.Errorf("%w: --extend-every extends the lease while an --exec command runs; it needs --exec", errUsage)
	case set["cohort"] && *cohortName == "":
		return fmt.Errorf("%w: --cohort needs a name (leave it out to compete for every partition)", errUsage)
	case set["member"] && *memberID == "":
		return fmt.Errorf("%w: --member needs an id (leave it out for a random one)", errUsage)
	case set["member"] && *cohortName == "":
		return fmt.Errorf("%w: --member names this consumer in a cohort; it needs --cohort", errUsage)
	case *extendEvery < 0:
		return fmt.Errorf("%w: --extend-every must not be negative, got %v", errUsage, *extendEvery)
	case *extendEvery > 0 && *extendEvery < time.Millisecond:
		return fmt.Errorf("%w: --extend-every %v is below 1ms", errUsage, *extendEvery)
	case *extendEvery > consumeExtendEveryMax:
		return fmt.Errorf("%w: --extend-every %v is above %v (each extension asks for 3x it, and a lease is at most a week)", errUsage, *extendEvery, consumeExtendEveryMax)
	}
	if *execCmd != "" && !set["prefetch"] {
		// One message is handled at a time: more would wait out their
		// leases in the buffer.
		*prefetch = 1
	}
	if err := checkBodyFormat(*bodyFormat); err != nil {
		return err
	}
	if *peek {
		// Nothing is settled, so the broker stops delivering at the prefetch:
		// a peek asks for exactly the messages it will show.
		if *count == 0 {
			*count = consumePeekCountDefault
		}
		if !set["idle-exit"] {
			*idleExit = consumePeekIdleExitDefault
		}
		if err := checkRange("count", int64(*count), 1, consumePrefetchMax); err != nil {
			return err
		}
		*prefetch = *count
	}
	// The wire carries a 32-bit prefetch; the bound is the largest
	// limits.prefetch_max a broker accepts.
	if err := checkRange("prefetch", int64(*prefetch), 0, consumePrefetchMax); err != nil {
		return err
	}

	if *execCmd != "" && *cohortName != "" {
		// Commands run one at a time on this goroutine while another
		// reports the assignments: both write to stderr, and so does the
		// client's log. A file takes concurrent writes as they are, and
		// the commands then get it itself (a pipe would make them wait
		// for anything they left running); another writer is locked.
		if _, isFile := stderr.(*os.File); !isFile {
			stderr = &lockedWriter{w: stderr}
		}
	}
	var dialOpts []sinew.Option
	if *memberID != "" {
		dialOpts = append(dialOpts, sinew.WithMemberID(*memberID))
	}
	c, err := cf.dial(ctx, "sinew-consume", stderr, dialOpts...)
	if err != nil {
		return err
	}
	defer c.Close()
	opts := []sinew.SubscribeOption{sinew.WithPrefetch(*prefetch)}
	if *cohortName != "" {
		opts = append(opts, sinew.WithCohort(*cohortName))
	}
	if *group != "" {
		opts = append(opts, sinew.WithSubscribeGroup(*group))
	}
	if *autoAck {
		opts = append(opts, sinew.WithAutoAck())
	}
	sub, err := c.Subscribe(ctx, *topic, opts...)
	if err != nil {
		if errors.Is(err, sinew.ErrInvalidArgument) {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		return describeClientErr(*cf.addr, err)
	}
	if *cohortName != "" {
		fmt.Fprintf(stderr, "joined cohort %s as member %s\n", *cohortName, c.MemberID())
	}

	if *execCmd != "" {
		x := &consumeExec{cmd: *execCmd, extendEvery: *extendEvery, stdout: stdout, stderr: stderr, addr: *cf.addr}
		if *cohortName != "" {
			stop := reportAssignments(stderr, sub)
			defer stop()
		}
		return x.run(ctx, sub, *count, *idleExit)
	}

	out := bufio.NewWriter(stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	var idle <-chan time.Time
	var idleTimer *time.Timer
	if *idleExit > 0 {
		idleTimer = time.NewTimer(*idleExit)
		defer idleTimer.Stop()
		idle = idleTimer.C
	}
	// Printing and acking are batched: a message is printed into out, and
	// once out is flushed (when no delivery is waiting, or half the prefetch
	// window is printed), every message it held is acked with CompleteAsync,
	// so it is still printed before it is acked. Flushing and waiting for an
	// ack's fsync per message held the run to about one round trip a message.
	batchMax := consumeBatchDefault
	if *prefetch > 0 {
		batchMax = max(1, *prefetch/2)
	}
	a := &consumeAcks{out: out, stderr: stderr, addr: *cf.addr, pendingMax: 2*max(*prefetch, consumeBatchDefault) + 64}
	for n := 0; *count == 0 || n < *count; n++ {
		var m *sinew.Message
		select {
		case m = <-sub.Messages():
		default:
			// Nothing waiting: print and ack what this batch holds before
			// blocking, so output and acks never wait on the next delivery.
			if err := a.flush(); err != nil {
				return err
			}
			select {
			case m = <-sub.Messages():
			case as := <-sub.Assignments():
				// Not a message: report it and wait again.
				reportAssignment(stderr, as)
				n--
				continue
			case <-idle:
				if err := a.finish(ctx); err != nil {
					return err
				}
				return finishConsume(sub, out)
			case <-ctx.Done():
				// Interrupted, a normal way to stop a consumer: what was
				// printed is acked before the unsubscribe hands the
				// unsettled rest back, so it is not delivered again.
				wctx, cancel := context.WithTimeout(context.Background(), consumeUnsubscribeTimeout)
				_ = a.finish(wctx)
				cancel()
				_ = finishConsume(sub, out)
				return nil
			}
		}
		if m == nil {
			err := sub.Err()
			if errors.Is(err, sinew.ErrClientClosed) || errors.Is(err, sinew.ErrUnsubscribed) {
				return a.flush()
			}
			_ = a.flush()
			return fmt.Errorf("subscription ended: %w", describeClientErr(*cf.addr, err))
		}
		var err error
		switch {
		case *asJSON:
			err = enc.Encode(messageJSON(m))
		case *peek:
			err = writePeekText(out, m, *bodyFormat)
		default:
			_, err = fmt.Fprintf(out, "%s\n", m.Body)
		}
		if err != nil {
			return err
		}
		if idleTimer != nil {
			idleTimer.Reset(*idleExit)
		}
		if *peek {
			// Left unsettled: the unsubscribe at the end hands it back.
			continue
		}
		a.printed = append(a.printed, m)
		if len(a.printed) >= batchMax {
			if err := a.flush(); err != nil {
				return err
			}
		}
		if err := a.reap(ctx, false); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	if err := a.finish(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	return finishConsume(sub, out)
}

// consumeBatchDefault is how many printed messages consume acks at once
// when --prefetch 0 leaves the window to the broker.
const consumeBatchDefault = 32

// consumeAcks acks what consume has printed, in batches, after the output
// holding them is flushed.
type consumeAcks struct {
	out    *bufio.Writer
	stderr io.Writer
	addr   string

	printed     []*sinew.Message // in out's buffer, not yet flushed
	pending     []consumeAck     // acked, outcome not yet seen; oldest first
	pendingMax  int              // beyond it, reap waits for the oldest
	staleWarned bool
}

type consumeAck struct {
	m *sinew.Message
	f *sinew.SettleFuture
}

// flush writes out what is printed and then acks those messages.
func (a *consumeAcks) flush() error {
	if err := a.out.Flush(); err != nil {
		return err
	}
	for _, m := range a.printed {
		a.pending = append(a.pending, consumeAck{m, m.CompleteAsync()})
	}
	clear(a.printed)
	a.printed = a.printed[:0]
	return nil
}

// reap looks at the outcomes of the oldest acks: those resolved, and with
// wait (or beyond pendingMax) the rest in turn. A stale ack is reported once
// and the run carries on, since the broker delivers that message again.
func (a *consumeAcks) reap(ctx context.Context, wait bool) error {
	for len(a.pending) > 0 {
		p := a.pending[0]
		if wait || len(a.pending) > a.pendingMax {
			select {
			case <-p.f.Done():
			case <-ctx.Done():
				return ctx.Err()
			}
		} else {
			select {
			case <-p.f.Done():
			default:
				return nil
			}
		}
		a.pending = a.pending[1:]
		err := p.f.Err()
		switch {
		case err == nil:
		case errors.Is(err, sinew.ErrStaleDelivery):
			// The lease moved on (a restart or a lease timeout): the
			// broker delivers the message again, so at-least-once holds
			// and the consumer carries on.
			if !a.staleWarned {
				a.staleWarned = true
				fmt.Fprintf(a.stderr, "sinew consume: warning: ack of partition %d offset %d was stale; the message will be delivered again (further stale acks not reported)\n", p.m.Partition, p.m.Offset)
			}
		default:
			return fmt.Errorf("ack of partition %d offset %d: %w", p.m.Partition, p.m.Offset, describeClientErr(a.addr, err))
		}
	}
	return nil
}

// finish flushes, acks what is printed and waits for every ack's outcome.
func (a *consumeAcks) finish(ctx context.Context) error {
	if err := a.flush(); err != nil {
		return err
	}
	return a.reap(ctx, true)
}

// consumeHelp explains consume's output; the flag set prints it above the flags.
const consumeHelp = `usage: sinew consume --topic T [flags]

Prints messages from a queue. By default each body is printed as it is,
followed by a newline, and the message is acked once printed (a crash between
the two shows it again, never loses it). Messages are printed and acked in
batches of up to half the prefetch: the output is flushed first, then the
batch is acked without waiting for each ack, and the command waits for every
ack before it exits.

--json prints one object per line instead: topic, group, partition, offset,
attempt, published_at_ms, key, content_type, headers (a list of {key, value},
in publish order), body. body and key are the bytes themselves when they are
valid UTF-8, else base64, as body_encoding and key_encoding say ("utf8" or
"base64"); a header value that is not UTF-8 has value_encoding "base64".

--exec CMD runs CMD with sh -c once per message, one message at a time, the
body on its standard input and SINEW_TOPIC, SINEW_GROUP, SINEW_PARTITION,
SINEW_OFFSET and SINEW_ATTEMPT in its environment; its output goes to
consume's. Exit status 0 completes the message (ACK); any other status, or a
command that cannot run, retries it (NACK, which uses up one of the queue's
retries). The prefetch is 1 unless --prefetch says otherwise. A command that
may run longer than the queue's lease (30 s by default) needs --extend-every
D: while the command runs, the lease is extended every D, each time to 3 x D
from now, so choose D at most a third of the lease. Without it, a command
that outlives the lease sees its message delivered again to another
consumer, and its ACK is then stale.

--peek shows messages with their key, content type and headers and settles
none of them. It takes --count messages (default 10) with a prefetch of
--count, prints them, and unsubscribes, which hands every one back to the
queue at once without using a retry (docs/protocol.md 5.8). While it runs, the
messages it holds are leased to it and other consumers of the queue do not get
them, and each one's attempt number rises by one. To read messages without
leasing them at all, use sinew admin messages peek, which reads the log.

--cohort NAME joins cohort NAME (a consumer group): the members of one cohort
share the queue's partitions, each partition delivered to one member at a
time, in offset order (docs/cohorts.md). Each partition assigned to or revoked
from this consumer is reported on stderr. --member sets this consumer's member
id (default: a random one); two consumers running at once need different ids:
a second consumer started with the same id takes it over, and the first one
ends with a conflict error.

flags:
`

// reportAssignment tells the user on stderr that a partition of the
// cohort came or went.
// reportAssignments reports sub's assignments on w as they come, until
// the returned func is called (which waits for the reporter to end, then
// reports those still buffered) or the subscription ends.
func reportAssignments(w io.Writer, sub *sinew.Subscription) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case as := <-sub.Assignments():
				reportAssignment(w, as)
			case <-sub.Done():
				return
			case <-quit:
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-done
		for { // what came before the end is reported too
			select {
			case as := <-sub.Assignments():
				reportAssignment(w, as)
			default:
				return
			}
		}
	}
}

// lockedWriter serialises the writes of goroutines that share a writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func reportAssignment(w io.Writer, a sinew.Assignment) {
	what := "revoked"
	if a.Assigned {
		what = "assigned"
	}
	fmt.Fprintf(w, "partition %d %s (assignment epoch %d)\n", a.Partition, what, a.Epoch)
}

// consumeExtendEveryMax bounds --extend-every: each extension asks for 3x
// it, and a lease is at most a week.
const consumeExtendEveryMax = 7 * 24 * time.Hour / 3

// consumeUnsubscribeTimeout bounds the unsubscribe on exit.
const consumeUnsubscribeTimeout = 5 * time.Second

func finishConsume(sub *sinew.Subscription, out *bufio.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), consumeUnsubscribeTimeout)
	defer cancel()
	_ = sub.Unsubscribe(ctx)
	return out.Flush()
}
