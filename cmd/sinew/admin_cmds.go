package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

func init() {
	adminCommands["overview"] = adminCommand{summary: "version, uptime, readiness, totals and counters", run: adminOverview}
	adminCommands["version"] = adminCommand{summary: "this binary's version and the broker's", run: adminVersion}
	adminCommands["queues"] = adminCommand{summary: "list queues with their depth, state and bytes on disk", run: adminQueues}
	adminCommands["queue"] = adminCommand{summary: "one queue: show | declare | update | purge | delete", verbs: map[string]adminCommand{
		"show":    {summary: "a queue's config, counts and partitions", run: adminQueueShow},
		"declare": {summary: "create a queue, or set its whole config", run: adminQueueDeclare},
		"update":  {summary: "change some of a queue's limits", run: adminQueueUpdate},
		"purge":   {summary: "discard a queue's ready and delayed messages (inflight ones stay)", run: adminQueuePurge},
		"delete":  {summary: "remove a queue and every message in it", run: adminQueueDelete},
	}}
	adminCommands["sessions"] = adminCommand{summary: "client sessions, attached and dormant, with grace left", run: adminSessions}
	adminCommands["connections"] = adminCommand{summary: "open client connections", run: adminConnections}
	adminCommands["messages"] = adminCommand{summary: "messages peek: read messages from the log (leases and settles nothing)", verbs: map[string]adminCommand{
		"peek": {summary: "show messages of a queue with key, headers and a body preview", run: adminMessagesPeek},
	}}
	adminCommands["dlq"] = adminCommand{summary: "dead letters: list | replay", verbs: map[string]adminCommand{
		"list":   {summary: "dead letters with their reason and source", run: adminDLQList},
		"replay": {summary: "republish dead letters to their source queue: replay P:O...", run: adminDLQReplay},
	}}
	adminCommands["settings"] = adminCommand{summary: "runtime settings: get | set key=value...", verbs: map[string]adminCommand{
		"get": {summary: "the runtime settings, their version and ranges", run: adminSettingsGet},
		"set": {summary: "change runtime settings: set key=value... [--version N]", run: adminSettingsSet},
	}}
	adminCommands["drain"] = adminCommand{summary: "start the broker's planned drain, as SIGTERM does; the broker exits when it ends", run: adminDrain}
	adminCommands["nodes"] = adminCommand{summary: "the cluster's nodes as this broker sees them: alive, dead or left", run: adminNodes}
	adminCommands["node"] = adminCommand{summary: "cluster nodes: leave | forget", verbs: map[string]adminCommand{
		"leave":  {summary: "leave the cluster (the others see it left, not dead), then drain and exit", run: adminNodeLeave},
		"forget": {summary: "record a dead node as left, here and on every alive node: forget ID", run: adminNodeForget},
	}}
}

// adminGet fetches path and prints it raw with --json; otherwise it decodes
// it into v for the caller to render and returns render=true.
func adminGet(ctx context.Context, c *adminClient, f adminFlags, path string, q url.Values, stdout io.Writer, v any) (render bool, err error) {
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodGet, path, q, nil, &raw); err != nil {
		return false, err
	}
	if *f.json {
		return false, printRaw(stdout, raw)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return false, fmt.Errorf("admin API at %s: the answer to GET %s is not the JSON expected: %v", c.addr, path, err)
	}
	return true, nil
}

// adminSetup parses a command's flags (no positionals) and returns its client.
func adminSetup(fs *flag.FlagSet, f adminFlags, args []string) (*adminClient, error) {
	if err := noArgs(fs, args); err != nil {
		return nil, err
	}
	return f.client()
}

// queueFlags name a queue.
type queueFlags struct{ topic, group *string }

func addQueueFlags(fs *flag.FlagSet) queueFlags {
	return queueFlags{
		topic: fs.String("topic", "", "queue topic (required)"),
		group: fs.String("group", "", "queue group (default: the default group)"),
	}
}

func (q queueFlags) check() error {
	if *q.topic == "" {
		return fmt.Errorf("%w: --topic is required", errUsage)
	}
	return nil
}

func (q queueFlags) String() string { return queueName(*q.topic, *q.group) }

func queueName(topic, group string) string {
	return fmt.Sprintf("queue %s group %s", strconv.Quote(topic), strconv.Quote(group))
}

func groupCell(g string) string {
	if g == "" {
		return "(default)"
	}
	return g
}

func msTime(ms int64) string {
	if ms == 0 {
		return "-"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}

func msDuration(ms int64) string {
	return (time.Duration(ms) * time.Millisecond).Round(time.Millisecond).String()
}

func adminOverview(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	var o apiOverview
	if render, err := adminGet(ctx, c, f, "/api/v1/overview", nil, stdout, &o); !render {
		return err
	}
	t := newTable(stdout, "FIELD", "VALUE")
	t.row("version", fmt.Sprintf("%s (api %s)", o.Version, o.API))
	t.row("owner id", o.OwnerID)
	t.row("generation", strconv.FormatUint(o.Generation, 10))
	t.row("started", msTime(o.StartedAtMs))
	t.row("uptime", msDuration(o.UptimeMs))
	ready := "yes"
	if !o.Ready {
		ready = "no"
	}
	if len(o.Problems) > 0 {
		ready = fmt.Sprintf("no: %s", strings.Join(o.Problems, "; "))
	}
	t.row("ready", ready)
	t.row("draining", strconv.FormatBool(o.Draining))
	t.row("queues", fmt.Sprintf("%d (%d partitions)", o.Queues, o.Partitions))
	for _, k := range sortedKeys(o.Totals) {
		v := strconv.FormatInt(o.Totals[k], 10)
		if k == "bytes_on_disk" {
			v = formatBytes(o.Totals[k])
		}
		t.row(k, v)
	}
	for _, k := range sortedKeys(o.Counters) {
		t.row(k+" (total)", strconv.FormatInt(o.Counters[k], 10))
	}
	for _, k := range sortedKeys(o.DeadLetteredByReason) {
		t.row("dead_lettered "+k+" (total)", strconv.FormatInt(o.DeadLetteredByReason[k], 10))
	}
	return t.flush()
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func adminVersion(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	var raw json.RawMessage
	_, berr := c.do(ctx, http.MethodGet, "/api/v1/version", nil, nil, &raw)
	if *f.json {
		// The CLI's version is known without the broker; print it either way.
		out := struct {
			CLI    versionInfo     `json:"cli"`
			Broker json.RawMessage `json:"broker,omitempty"`
		}{CLI: currentVersion(), Broker: raw}
		if err := writeJSONOut(stdout, out); err != nil {
			return err
		}
		return berr
	}
	fmt.Fprintf(stdout, "cli:    %s\n", currentVersion())
	if berr != nil {
		return berr
	}
	var v apiVersion
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("admin API at %s: the version answer is not the JSON expected: %v", c.addr, err)
	}
	_, err = fmt.Fprintf(stdout, "broker: %s (api %s) at %s\n", displayBytes([]byte(v.Version)), displayBytes([]byte(v.API)), c.addr)
	return err
}

func adminQueues(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	var qs apiQueues
	if render, err := adminGet(ctx, c, f, "/api/v1/queues", nil, stdout, &qs); !render {
		return err
	}
	t := newTable(stdout, "TOPIC", "GROUP", "STATE", "PARTITIONS", "READY", "DELAYED", "INFLIGHT", "DEAD-LETTERING", "CONSUMERS", "DISK")
	for _, q := range qs.Queues {
		topic := q.Topic
		if q.DeadLetterQueue {
			topic += " (dlq)"
		}
		t.row(topic, groupCell(q.Group), q.State, strconv.FormatInt(q.PartitionCount, 10),
			strconv.FormatInt(q.Ready, 10), strconv.FormatInt(q.Delayed, 10), strconv.FormatInt(q.Inflight, 10),
			strconv.FormatInt(q.DeadLettering, 10), strconv.FormatInt(q.Consumers, 10), formatBytes(q.BytesOnDisk))
	}
	if len(qs.Queues) == 0 {
		fmt.Fprintln(stderr, "no queues")
	}
	return t.flush()
}

func adminQueueShow(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	qf := addQueueFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	if err := qf.check(); err != nil {
		return err
	}
	var q apiQueue
	if render, err := adminGet(ctx, c, f, queuePath(*qf.topic), groupQuery(*qf.group), stdout, &q); !render {
		return err
	}
	return writeQueue(stdout, q)
}

// writeQueue prints a queue for a person: its config and counts, then a
// table of its partitions.
func writeQueue(w io.Writer, q apiQueue) error {
	t := newTable(w, "FIELD", "VALUE")
	t.row("topic", q.Topic)
	t.row("group", groupCell(q.Group))
	t.row("state", q.State)
	t.row("dead-letter queue", strconv.FormatBool(q.DeadLetterQueue))
	dl := q.Config.DeadLetterMode
	if q.Config.DeadLetterTarget != "" {
		dl += " -> " + q.Config.DeadLetterTarget
	}
	t.row("dead letters", dl)
	t.row("max retries", strconv.FormatInt(q.Config.MaxRetries, 10))
	t.row("lease", msDuration(q.Config.LeaseMs))
	ttl := "none"
	if q.Config.DefaultTTLMs > 0 {
		ttl = msDuration(q.Config.DefaultTTLMs)
	}
	t.row("default ttl", ttl)
	t.row("messages", fmt.Sprintf("ready %d, delayed %d, inflight %d, dead-lettering %d", q.Ready, q.Delayed, q.Inflight, q.DeadLettering))
	t.row("consumers", strconv.FormatInt(q.Consumers, 10))
	t.row("disk", formatBytes(q.BytesOnDisk))
	if err := t.flush(); err != nil {
		return err
	}
	io.WriteString(w, "\n")
	pt := newTable(w, "PARTITION", "STATE", "READY", "DELAYED", "INFLIGHT", "DEAD-LETTERING", "CONSUMERS", "NEXT-OFFSET", "SETTLED-FRONTIER", "DISK", "REASON")
	for _, p := range q.Partitions {
		pt.row(strconv.FormatUint(uint64(p.Partition), 10), p.State, strconv.FormatInt(p.Ready, 10), strconv.FormatInt(p.Delayed, 10),
			strconv.FormatInt(p.Inflight, 10), strconv.FormatInt(p.DeadLettering, 10), strconv.FormatInt(p.Consumers, 10),
			strconv.FormatUint(p.NextOffset, 10), strconv.FormatUint(p.SettledFrontier, 10), formatBytes(p.BytesOnDisk), p.Reason)
	}
	return pt.flush()
}

// declareFlags are the queue config flags of declare and update.
type declareFlags struct {
	partitions, maxRetries, ttlMs, leaseMs *int64
	dlMode, dlTarget                       *string
}

func addDeclareFlags(fs *flag.FlagSet, withPartitions bool) declareFlags {
	d := declareFlags{
		maxRetries: fs.Int64("max-retries", 0, "failed deliveries before a message is dead-lettered"),
		ttlMs:      fs.Int64("default-ttl-ms", 0, "dead-letter messages not delivered within this many ms (0 = never)"),
		leaseMs:    fs.Int64("lease-ms", 0, "how long a delivery is leased to its consumer, in ms"),
		dlMode:     fs.String("dead-letter-mode", "", "where dead letters go: default, discard, global or queue"),
		dlTarget:   fs.String("dead-letter-target", "", "the dead-letter topic, with --dead-letter-mode queue"),
	}
	if withPartitions {
		d.partitions = fs.Int64("partitions", 0, "partition count (fixed once the queue exists)")
	}
	return d
}

// body returns the declare body with only the flags given on the command line.
func (d declareFlags) body(fs *flag.FlagSet) apiQueueDeclare {
	var b apiQueueDeclare
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "partitions":
			b.Partitions = d.partitions
		case "max-retries":
			b.MaxRetries = d.maxRetries
		case "default-ttl-ms":
			b.DefaultTTLMs = d.ttlMs
		case "lease-ms":
			b.LeaseMs = d.leaseMs
		case "dead-letter-mode":
			b.DeadLetterMode = d.dlMode
		case "dead-letter-target":
			b.DeadLetterTarget = d.dlTarget
		}
	})
	return b
}

func adminQueueDeclare(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	return adminQueueConfig(ctx, name, args, stdout, stderr, http.MethodPut)
}

func adminQueueUpdate(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	return adminQueueConfig(ctx, name, args, stdout, stderr, http.MethodPatch)
}

// adminQueueConfig declares (PUT) or updates (PATCH) a queue and shows it.
func adminQueueConfig(ctx context.Context, name string, args []string, stdout, stderr io.Writer, method string) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	qf := addQueueFlags(fs)
	df := addDeclareFlags(fs, method == http.MethodPut)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	if err := qf.check(); err != nil {
		return err
	}
	body := df.body(fs)
	if body.Partitions != nil && (*body.Partitions < 0 || *body.Partitions > math.MaxUint32) {
		return fmt.Errorf("%w: --partitions %d: give 1 or more (0, or no flag, takes the broker's default)", errUsage, *body.Partitions)
	}
	if method == http.MethodPatch && body == (apiQueueDeclare{}) {
		return fmt.Errorf("%w: nothing to update: give at least one of --max-retries, --default-ttl-ms, --lease-ms, --dead-letter-mode, --dead-letter-target", errUsage)
	}
	var raw json.RawMessage
	status, err := c.do(ctx, method, queuePath(*qf.topic), groupQuery(*qf.group), body, &raw)
	if err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	var q apiQueue
	if err := json.Unmarshal(raw, &q); err != nil {
		return fmt.Errorf("admin API at %s: the queue answer is not the JSON expected: %v", c.addr, err)
	}
	verb := "updated"
	switch {
	case method == http.MethodPut && status == http.StatusCreated:
		verb = "created"
	case method == http.MethodPut:
		verb = "declared (it existed; config now as given)"
	}
	fmt.Fprintf(stdout, "%s %s\n\n", verb, qf)
	return writeQueue(stdout, q)
}

func adminQueuePurge(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	qf := addQueueFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	if err := qf.check(); err != nil {
		return err
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, queuePath(*qf.topic, "purge"), groupQuery(*qf.group), nil, &raw); err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	var r struct {
		Purged int64 `json:"purged"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("admin API at %s: the purge answer is not the JSON expected: %v", c.addr, err)
	}
	_, err = fmt.Fprintf(stdout, "purged %d messages from %s\n", r.Purged, qf)
	return err
}

func adminQueueDelete(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	qf := addQueueFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	if err := qf.check(); err != nil {
		return err
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodDelete, queuePath(*qf.topic), groupQuery(*qf.group), nil, &raw); err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	_, err = fmt.Fprintf(stdout, "deleted %s\n", qf)
	return err
}

func adminSessions(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	var ss apiSessions
	if render, err := adminGet(ctx, c, f, "/api/v1/sessions", nil, stdout, &ss); !render {
		return err
	}
	t := newTable(stdout, "CLIENT", "STATE", "CONN", "GRACE-LEFT", "INFLIGHT", "PENDING", "SUBSCRIPTIONS")
	for _, s := range ss.Sessions {
		conn, grace := "-", "-"
		if s.ConnID != 0 {
			conn = strconv.FormatUint(s.ConnID, 10)
		}
		if s.GraceLeftMs != nil {
			grace = msDuration(*s.GraceLeftMs)
		}
		var subs []string
		for _, sub := range s.Subscriptions {
			// Names are escaped here, so the joined cell is not escaped again.
			part := ""
			if sub.Partition != nil && *sub.Partition >= 0 {
				part = fmt.Sprintf("[partition %d]", *sub.Partition)
			}
			mode := ""
			if sub.AutoAck {
				mode = ", auto-ack"
			}
			subs = append(subs, fmt.Sprintf("%s/%s%s(prefetch %d, inflight %d%s)", displayBytes([]byte(sub.Topic)),
				displayBytes([]byte(groupCell(sub.Group))), part, sub.Prefetch, sub.Inflight, mode))
		}
		t.row(s.ClientID, s.State, conn, grace, strconv.FormatInt(s.Inflight, 10), strconv.FormatInt(s.Pending, 10), shown(strings.Join(subs, ", ")))
	}
	if len(ss.Sessions) == 0 {
		fmt.Fprintln(stderr, "no sessions")
	}
	return t.flush()
}

func adminConnections(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	var cs apiConnections
	if render, err := adminGet(ctx, c, f, "/api/v1/connections", nil, stdout, &cs); !render {
		return err
	}
	t := newTable(stdout, "CONN", "REMOTE", "CLIENT", "CONNECTED", "ESTABLISHED", "SUBSCRIPTIONS")
	for _, cn := range cs.Connections {
		// Not established: the handshake has not finished, so there is no session yet.
		t.row(strconv.FormatUint(cn.ConnID, 10), cn.RemoteAddr, cn.ClientID, msTime(cn.ConnectedAtMs),
			strconv.FormatBool(cn.Established), strconv.FormatInt(cn.Subscriptions, 10))
	}
	if len(cs.Connections) == 0 {
		fmt.Fprintln(stderr, "no connections")
	}
	return t.flush()
}

// Bounds of messages peek and dlq list, as the API has them; checked here so
// a bad value is a usage error before any request.
const (
	peekLimitMax        = 100
	peekPreviewBytesMax = 65536
	dlqLimitMax         = 200
	replayItemsMax      = 100
)

func adminMessagesPeek(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	qf := addQueueFlags(fs)
	partition := fs.Int64("partition", -1, "partition to read (default: every partition, --limit messages from each)")
	from := fs.Uint64("from", 0, "first offset to read (default: the first still on disk)")
	limit := fs.Int64("limit", 20, "messages to show per partition, 1 to 100")
	preview := fs.Int64("preview-bytes", 1024, "body bytes to show per message, 0 to 65536")
	bodyFormat := fs.String("body", "auto", "how to show bodies: auto (text as it is, anything else escaped), escaped or base64")
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	if err := errors.Join(qf.check(), checkRange("limit", *limit, 1, peekLimitMax),
		checkRange("preview-bytes", *preview, 0, peekPreviewBytesMax), checkBodyFormat(*bodyFormat)); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if set["partition"] {
		if err := checkRange("partition", *partition, 0, 1<<32-1); err != nil {
			return err
		}
	} else if set["from"] {
		return fmt.Errorf("%w: --from needs --partition (offsets are per partition)", errUsage)
	}
	page := func(p uint32) (json.RawMessage, apiMessages, error) {
		q := groupQuery(*qf.group)
		q.Set("partition", strconv.FormatUint(uint64(p), 10))
		q.Set("from", strconv.FormatUint(*from, 10))
		q.Set("limit", strconv.FormatInt(*limit, 10))
		q.Set("preview_bytes", strconv.FormatInt(*preview, 10))
		var raw json.RawMessage
		var m apiMessages
		if _, err := c.do(ctx, http.MethodGet, queuePath(*qf.topic, "messages"), q, nil, &raw); err != nil {
			return nil, m, err
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, m, fmt.Errorf("admin API at %s: the messages answer is not the JSON expected: %v", c.addr, err)
		}
		return raw, m, nil
	}
	var parts []uint32
	if set["partition"] {
		parts = []uint32{uint32(*partition)}
	} else {
		var q apiQueue
		if _, err := c.do(ctx, http.MethodGet, queuePath(*qf.topic), groupQuery(*qf.group), nil, &q); err != nil {
			return err
		}
		for i := int64(0); i < q.PartitionCount; i++ {
			parts = append(parts, uint32(i))
		}
	}
	var raws []json.RawMessage
	for _, p := range parts {
		raw, m, err := page(p)
		if err != nil {
			return err
		}
		if *f.json {
			raws = append(raws, raw)
			continue
		}
		if err := writeMessagesPage(stdout, m, *bodyFormat); err != nil {
			return err
		}
	}
	if !*f.json {
		return nil
	}
	if set["partition"] {
		return printRaw(stdout, raws[0])
	}
	// Every partition: the API's page for each, in partition order.
	return writeJSONOut(stdout, struct {
		Topic string            `json:"topic"`
		Group string            `json:"group"`
		Pages []json.RawMessage `json:"pages"`
	}{*qf.topic, *qf.group, raws})
}

// writeMessagesPage prints one partition's page of messages, each as a block.
func writeMessagesPage(w io.Writer, m apiMessages, bodyFormat string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "=== %s partition %d: %d message(s) from offset %d (next offset %d)\n",
		queueName(m.Topic, m.Group), m.Partition, len(m.Messages), m.From, m.NextOffset)
	for _, msg := range m.Messages {
		writeMessageBlock(&b, msg, bodyFormat, "")
	}
	if m.Next < m.NextOffset && len(m.Messages) > 0 {
		fmt.Fprintf(&b, "(more: --partition %d --from %d)\n", m.Partition, m.Next)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeMessageBlock prints one message of the API: its position and state,
// key, content type, headers and body preview. Bytes are shown with
// displayBytes (or as --body asks for bodies), so nothing is mangled.
func writeMessageBlock(b *strings.Builder, m apiMessage, bodyFormat, title string) {
	if title == "" {
		title = fmt.Sprintf("offset %d", m.Offset)
	}
	fmt.Fprintf(b, "--- %s  state %s  attempt %d  published %s\n", title, m.State, m.Attempt, msTime(m.PublishedAtMs))
	if m.KeyB64 != "" {
		fmt.Fprintf(b, "key: %s\n", b64Display(m.KeyB64, "auto"))
	}
	if m.ContentType != "" {
		fmt.Fprintf(b, "content-type: %s\n", displayBytes([]byte(m.ContentType)))
	}
	for _, h := range m.Headers {
		v := ""
		if h.Value != nil {
			v = displayBytes([]byte(*h.Value))
		} else {
			v = b64Display(h.ValueB64, "auto")
		}
		fmt.Fprintf(b, "header %s: %s\n", displayBytes([]byte(h.Key)), v)
	}
	if m.Error != "" {
		fmt.Fprintf(b, "body (%s): could not be read: %s\n", nBytes(m.BodyBytes), displayBytes([]byte(m.Error)))
		return
	}
	body := b64Display(m.BodyB64, bodyFormat)
	shown, _ := base64.StdEncoding.DecodeString(m.BodyB64)
	if m.BodyTruncated {
		fmt.Fprintf(b, "body (%s, first %d shown): %s\n", nBytes(m.BodyBytes), len(shown), body)
	} else {
		fmt.Fprintf(b, "body (%s): %s\n", nBytes(m.BodyBytes), body)
	}
}

// b64Display decodes a base64 field of the API and shows its bytes; a field
// that is not base64 is shown as it came, marked.
func b64Display(s, format string) string {
	data, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return fmt.Sprintf("(not base64: %s)", displayBytes([]byte(s)))
	}
	return displayBody(data, format)
}

func adminDLQList(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	topic := fs.String("topic", "", "dead-letter topic (default: the broker's queue.dead_letter_topic)")
	cursor := fs.String("cursor", "", "continue from a previous list (its next_cursor)")
	limit := fs.Int64("limit", 50, "dead letters to show, 1 to 200")
	preview := fs.Int64("preview-bytes", 64, "body bytes to show per dead letter, 0 to 65536")
	long := fs.Bool("long", false, "show each dead letter as a block with its headers and body, not a table row")
	bodyFormat := fs.String("body", "auto", "how to show bodies: auto (text as it is, anything else escaped), escaped or base64")
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	if err := errors.Join(checkRange("limit", *limit, 1, dlqLimitMax),
		checkRange("preview-bytes", *preview, 0, peekPreviewBytesMax), checkBodyFormat(*bodyFormat)); err != nil {
		return err
	}
	q := url.Values{}
	if *topic != "" {
		q.Set("topic", *topic)
	}
	if *cursor != "" {
		q.Set("cursor", *cursor)
	}
	q.Set("limit", strconv.FormatInt(*limit, 10))
	q.Set("preview_bytes", strconv.FormatInt(*preview, 10))
	var dl apiDeadLetters
	if render, err := adminGet(ctx, c, f, "/api/v1/deadletters", q, stdout, &dl); !render {
		return err
	}
	if *long {
		var b strings.Builder
		for _, d := range dl.DeadLetters {
			writeMessageBlock(&b, d.Message, *bodyFormat, fmt.Sprintf("%d:%d", d.Partition, d.Offset))
			fmt.Fprintf(&b, "dead-lettered: %s at %s after %d retries, from %s partition %d offset %d\n",
				displayBytes([]byte(d.Reason)), msTime(d.DeadLetteredAtMs), d.Retries,
				queueName(d.SourceTopic, d.SourceGroup), d.SourcePartition, d.SourceOffset)
		}
		io.WriteString(stdout, b.String())
	} else {
		t := newTable(stdout, "ITEM", "REASON", "SOURCE", "RETRIES", "DEAD-LETTERED-AT", "BODY")
		for _, d := range dl.DeadLetters {
			src := fmt.Sprintf("%s/%s %d:%d", displayBytes([]byte(d.SourceTopic)), displayBytes([]byte(groupCell(d.SourceGroup))), d.SourcePartition, d.SourceOffset)
			body := b64Display(d.Message.BodyB64, *bodyFormat)
			if d.Message.BodyTruncated {
				body += "..."
			}
			t.row(fmt.Sprintf("%d:%d", d.Partition, d.Offset), d.Reason, shown(src), strconv.FormatInt(d.Retries, 10), msTime(d.DeadLetteredAtMs), shown(body))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if len(dl.DeadLetters) == 0 {
		fmt.Fprintf(stderr, "no dead letters in %s\n", strconv.Quote(dl.Topic))
	}
	if dl.NextCursor != "" {
		fmt.Fprintf(stdout, "(more: --cursor %s)\n", dl.NextCursor)
	}
	return nil
}

// parseReplayItem parses "P:O" (partition:offset), as dlq list's ITEM shows it.
func parseReplayItem(s string) (apiReplayItem, error) {
	ps, os, ok := strings.Cut(s, ":")
	p, perr := strconv.ParseUint(ps, 10, 32)
	o, oerr := strconv.ParseUint(os, 10, 64)
	if !ok || perr != nil || oerr != nil {
		return apiReplayItem{}, fmt.Errorf("%w: %q is not partition:offset (as dlq list's ITEM column shows)", errUsage, s)
	}
	return apiReplayItem{Partition: uint32(p), Offset: o}, nil
}

// errReplayIncomplete marks a replay where some item was not replayed.
var errReplayIncomplete = errors.New("not every dead letter was replayed")

func adminDLQReplay(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	topic := fs.String("topic", "", "dead-letter topic (default: the broker's queue.dead_letter_topic)")
	keep := fs.Bool("keep", false, "keep the dead-letter copy (default: remove it once the replay is confirmed)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	c, err := f.client()
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return fmt.Errorf("%w: name the dead letters to replay as partition:offset (see sinew admin dlq list)", errUsage)
	}
	if len(pos) > replayItemsMax {
		return fmt.Errorf("%w: at most %d dead letters per replay, got %d", errUsage, replayItemsMax, len(pos))
	}
	req := apiReplayRequest{Topic: *topic, Keep: *keep}
	for _, s := range pos {
		it, err := parseReplayItem(s)
		if err != nil {
			return err
		}
		req.Items = append(req.Items, it)
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/api/v1/deadletters/replay", nil, req, &raw); err != nil {
		return err
	}
	var res apiReplayResults
	if err := json.Unmarshal(raw, &res); err != nil {
		return fmt.Errorf("admin API at %s: the replay answer is not the JSON expected: %v", c.addr, err)
	}
	failed := 0
	for _, r := range res.Results {
		if r.Status != "replayed" {
			failed++
		}
	}
	if *f.json {
		if err := printRaw(stdout, raw); err != nil {
			return err
		}
	} else {
		t := newTable(stdout, "ITEM", "STATUS", "TARGET", "REMOVED", "ERROR")
		for _, r := range res.Results {
			target := "-"
			if r.Status == "replayed" {
				target = fmt.Sprintf("%s/%s %d:%d", displayBytes([]byte(r.TargetTopic)), displayBytes([]byte(groupCell(r.TargetGroup))), r.TargetPartition, r.TargetOffset)
			}
			t.row(fmt.Sprintf("%d:%d", r.Partition, r.Offset), r.Status, shown(target), strconv.FormatBool(r.Removed), r.Error)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%w: %d of %d", errReplayIncomplete, failed, len(res.Results))
	}
	return nil
}

func adminSettingsGet(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	var s apiSettings
	if render, err := adminGet(ctx, c, f, "/api/v1/settings", nil, stdout, &s); !render {
		return err
	}
	return writeSettings(stdout, s)
}

func writeSettings(w io.Writer, s apiSettings) error {
	fmt.Fprintf(w, "runtime settings, version %d\n\n", s.Version)
	t := newTable(w, "KEY", "VALUE", "MIN", "MAX", "DESCRIPTION")
	described := map[string]bool{}
	for _, k := range s.RuntimeKeys {
		described[k.Key] = true
		v := "-"
		if x, ok := s.Values[k.Key]; ok {
			v = strconv.FormatInt(x, 10)
		}
		t.row(k.Key, v, strconv.FormatInt(k.Min, 10), strconv.FormatInt(k.Max, 10), k.Description)
	}
	for _, k := range sortedKeys(s.Values) {
		if !described[k] {
			t.row(k, strconv.FormatInt(s.Values[k], 10), "", "", "")
		}
	}
	return t.flush()
}

func adminSettingsSet(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	version := fs.Int64("version", -1, "the settings version this change is based on, as settings get shows it; the change is refused if another came first (default: the current version, read just before)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	c, err := f.client()
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return fmt.Errorf("%w: give the settings to change as key=value", errUsage)
	}
	values := map[string]int64{}
	for _, kv := range pos {
		k, v, ok := strings.Cut(kv, "=")
		n, nerr := strconv.ParseInt(v, 10, 64)
		if !ok || k == "" || nerr != nil {
			return fmt.Errorf("%w: %q is not key=integer", errUsage, kv)
		}
		if _, dup := values[k]; dup {
			return fmt.Errorf("%w: %s given twice", errUsage, k)
		}
		values[k] = n
	}
	put := apiSettingsPut{Values: values}
	if *version >= 0 {
		put.Version = uint64(*version)
	} else {
		var cur apiSettings
		if _, err := c.do(ctx, http.MethodGet, "/api/v1/settings", nil, nil, &cur); err != nil {
			return err
		}
		put.Version = cur.Version
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPut, "/api/v1/settings", nil, put, &raw); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.status == http.StatusConflict {
			var cur apiSettings
			if json.Unmarshal(ae.body, &cur) == nil && cur.Version != 0 {
				return fmt.Errorf("%w; nothing changed: the settings are at version %d now; check them (settings get) and retry", err, cur.Version)
			}
		}
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	var s apiSettings
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("admin API at %s: the settings answer is not the JSON expected: %v", c.addr, err)
	}
	return writeSettings(stdout, s)
}

func adminDrain(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/api/v1/drain", nil, nil, &raw); err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	_, err = fmt.Fprintf(stdout, "drain started on the broker at %s\n", c.addr)
	return err
}

// apiNodes is GET /api/v1/nodes (admin.NodesView).
type apiNodes struct {
	Cluster    bool      `json:"cluster"`
	Self       apiNode   `json:"self"`
	Fenced     bool      `json:"fenced"`
	Nodes      []apiNode `json:"nodes"`
	Controller *struct {
		Leader   string   `json:"leader"`
		Voters   []string `json:"voters"`
		Learners []string `json:"learners"`
		Nodes    []struct {
			ID   string `json:"id"`
			Left bool   `json:"left"`
		} `json:"nodes"`
		Error string `json:"error"`
	} `json:"controller"`
}

// controllerRole is a node's place in the controller group: leader,
// voter, learner, left, or "-" (not in the committed table).
func (v apiNodes) controllerRole(id string) string {
	c := v.Controller
	if c == nil {
		return "-"
	}
	switch {
	case id == c.Leader:
		return "leader"
	case slices.Contains(c.Voters, id):
		return "voter"
	case slices.Contains(c.Learners, id):
		return "learner"
	}
	for _, n := range c.Nodes {
		if n.ID == id && n.Left {
			return "left"
		}
	}
	return "-"
}

type apiNode struct {
	ID         string `json:"id"`
	State      string `json:"state"`
	GossipAddr string `json:"gossip_addr"`
	ClientAddr string `json:"client_addr"`
}

func adminNodes(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	var v apiNodes
	if render, err := adminGet(ctx, c, f, "/api/v1/nodes", nil, stdout, &v); !render {
		return err
	}
	if !v.Cluster {
		_, err := fmt.Fprintf(stdout, "the broker at %s runs alone (cluster.enabled = false)\n", c.addr)
		return err
	}
	t := newTable(stdout, "NODE", "STATE", "GOSSIP", "CLIENT", "CONTROLLER")
	self := v.Self
	if v.Fenced {
		self.State = "self (fenced)"
	}
	t.row(self.ID, self.State, self.GossipAddr, self.ClientAddr, v.controllerRole(self.ID))
	for _, n := range v.Nodes {
		t.row(n.ID, n.State, n.GossipAddr, n.ClientAddr, v.controllerRole(n.ID))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if v.Controller != nil && v.Controller.Error != "" {
		_, err := fmt.Fprintf(stdout, "this node's controller replica failed: %s\n", v.Controller.Error)
		return err
	}
	return nil
}

func adminNodeLeave(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/api/v1/nodes/self/leave", nil, nil, &raw); err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	_, err = fmt.Fprintf(stdout, "the broker at %s left its cluster and is draining; it exits when the drain ends\n", c.addr)
	return err
}

func adminNodeForget(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" || len(pos[0]) > nodeIDBytesMax {
		return fmt.Errorf("%w: name one dead node to forget by its id, at most %d characters (see sinew admin nodes)", errUsage, nodeIDBytesMax)
	}
	id := pos[0]
	c, err := f.client()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/api/v1/nodes/"+url.PathEscape(id)+"/forget", nil, nil, &raw); err != nil {
		return err
	}
	if *f.json {
		return printRaw(stdout, raw)
	}
	_, err = fmt.Fprintf(stdout, "node %s is recorded as left by the broker at %s, which tells every alive node it can reach\n", id, c.addr)
	return err
}

// nodeIDBytesMax bounds the node id `node forget` sends (ids are 32 hex
// digits; memberlist names are bounded too).
const nodeIDBytesMax = 256
