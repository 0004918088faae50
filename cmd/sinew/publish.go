package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/vfs"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/protocol"
)

// Shared by publish and consume.
const (
	// clientAddrDefault is where `sinew serve` listens unless told otherwise.
	clientAddrDefault = "127.0.0.1:7654"
	// clientConnectTimeoutDefault bounds the first connect (all attempts
	// together), so an unreachable address fails instead of retrying forever.
	clientConnectTimeoutDefault = 5 * time.Second
	// clientReconnectOutageMax bounds a reconnect after a cut by time, not
	// by a count: after GOING_AWAY the SDK retries every 100 ms, so a count
	// would be spent within a drain. Two minutes ride through a drain (10 s
	// by default) plus a restart, while a broker gone for good still ends
	// the command.
	clientReconnectOutageMax = 2 * time.Minute
	// publishBodyBytesMax bounds one message body, from a stdin line or
	// generated with --size: the broker's default limits.body_bytes_max.
	publishBodyBytesMax = 1 << 20
	// publishWindowMax bounds --window (confirms in flight).
	publishWindowMax = 1 << 16
)

// publishHelp explains publish's output; the flag set prints it above the flags.
const publishHelp = `usage: sinew publish --topic T [flags] < lines

Publishes one message per stdin line (without its line ending), or --count
generated ones. A line may hold at most 1048576 bytes (the broker's default body
limit); a longer line stops the command with an error, after the messages before
it have been confirmed or have failed.

Unless its flags are invalid, the command always ends with one summary line
(also when the broker cannot be reached):

  published to T: confirmed N, failed M

(with --no-confirm: "published to T: sent N unconfirmed, failed M"). Confirmed
messages are stored durably; failed ones were sent but not confirmed. The
summary goes to stdout, or to stderr with --json so that stdout holds only the
JSON lines, one per confirmed message. After a failure the exit status is 1 and
the first error follows the summary on stderr.

flags:
`

func init() {
	commands["publish"] = command{
		summary: "publish messages from stdin (one per line) or generated ones",
		run:     runPublish,
	}
}

// clientFlags are the connection flags of the client commands.
type clientFlags struct {
	credFlags
	addr    *string
	timeout *time.Duration
	tls     tlsFlags
	verbose *bool
}

// credFlags are the login flags of every command that connects to a broker.
type credFlags struct {
	token        *string
	user         *string
	passwordFile *string
}

func addCredFlags(fs *flag.FlagSet) credFlags {
	return credFlags{
		token: fs.String("token", os.Getenv("SINEW_TOKEN"), "auth token (env SINEW_TOKEN)"),
		user: fs.String("user", os.Getenv("SINEW_USER"),
			"log in as this user (env SINEW_USER); the password comes from env SINEW_PASSWORD or --password-file, never from the command line"),
		passwordFile: fs.String("password-file", "", "read the --user password from the first line of this `file`"),
	}
}

func addClientFlags(fs *flag.FlagSet) clientFlags {
	addr := os.Getenv("SINEW_ADDR")
	if addr == "" {
		addr = clientAddrDefault
	}
	return clientFlags{
		addr:      fs.String("addr", addr, "broker address `host:port` (env SINEW_ADDR); for a cluster, several comma-separated: the first is dialled, the others are seeds the client turns to when a partition's owner is elsewhere or gone"),
		credFlags: addCredFlags(fs),
		timeout:   fs.Duration("connect-timeout", clientConnectTimeoutDefault, "give up the first connect after this long"),
		tls:       addTLSFlags(fs),
		verbose:   fs.Bool("verbose", false, "log the client's connection events to stderr, each failed connect attempt included"),
	}
}

// dial connects with bounded retries and turns failures into one line naming
// the problem. Failed connect attempts are logged only with --verbose: the
// final error names the last one, and a line per attempt before it is noise
// to someone who only mistyped an address or has not started the broker.
// Reconnects after a cut are not logged either (the client rides through
// them); other warnings of the client are.
func (f clientFlags) dial(ctx context.Context, name string, stderr io.Writer, extra ...sinew.Option) (*sinew.Client, error) {
	if *f.timeout <= 0 {
		return nil, fmt.Errorf("%w: --connect-timeout must be positive", errUsage)
	}
	addrs, err := clientAddrs(*f.addr)
	if err != nil {
		return nil, err
	}
	cred, err := f.credentials()
	if err != nil {
		return nil, err
	}
	tcfg, err := f.tls.config()
	if err != nil {
		return nil, err
	}
	level := slog.LevelWarn
	if *f.verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(quietConnectHandler{slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})})
	opts := []sinew.Option{sinew.WithClientName(name), cred,
		sinew.WithConnectTimeout(*f.timeout), sinew.WithLogger(logger),
		sinew.WithReconnect(sinew.ReconnectPolicy{MaxOutage: clientReconnectOutageMax})}
	if tcfg != nil {
		opts = append(opts, sinew.WithTLS(tcfg))
	}
	if len(addrs) > 1 {
		opts = append(opts, sinew.WithSeeds(addrs[1:]...))
	}
	opts = append(opts, extra...)
	c, err := sinew.Dial(ctx, addrs[0], opts...)
	if err != nil {
		return nil, describeClientErr(addrs[0], err)
	}
	return c, nil
}

// clientAddrs splits --addr: one host:port, or several comma-separated
// (a cluster's nodes), each of which must be host:port.
func clientAddrs(flagValue string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(flagValue, ",") {
		a = strings.TrimSpace(a)
		if err := checkHostPort("--addr", a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// passwordFileBytesMax bounds what --password-file reads: a password is at
// most auth.PasswordBytesMax bytes, plus its line ending.
const passwordFileBytesMax = auth.PasswordBytesMax + 2

// credentials picks the HELLO credentials: --user with its password, or
// --token. The password is never a flag value, because the command line of
// a running process is visible to every local user (ps, /proc/PID/cmdline)
// and often lands in shell history.
func (f credFlags) credentials() (sinew.Option, error) {
	if *f.user == "" {
		if *f.passwordFile != "" {
			return nil, fmt.Errorf("%w: --password-file needs --user", errUsage)
		}
		return sinew.WithCredentials(*f.token), nil
	}
	if *f.token != "" {
		return nil, fmt.Errorf("%w: give --user or --token (SINEW_TOKEN), not both", errUsage)
	}
	password, err := userPassword(*f.user, *f.passwordFile)
	if err != nil {
		return nil, err
	}
	return sinew.WithUser(*f.user, password), nil
}

// userPassword returns the password of user: the first line of
// passwordFile when it is given, else SINEW_PASSWORD. The client commands
// and sinew admin share it.
func userPassword(user, passwordFile string) (string, error) {
	password := os.Getenv("SINEW_PASSWORD")
	if passwordFile != "" {
		b, err := vfs.ReadFileMax(vfs.OS(), passwordFile, passwordFileBytesMax)
		if err != nil {
			return "", fmt.Errorf("--password-file: %w", err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		password = strings.TrimSuffix(line, "\r")
	}
	if password == "" {
		return "", fmt.Errorf("%w: --user %s needs a password: set SINEW_PASSWORD or give --password-file", errUsage, user)
	}
	return password, nil
}

func describeClientErr(addr string, err error) error {
	var be *sinew.BrokerError
	switch {
	case errors.As(err, &be) && be.Code == protocol.CodeAuthFailed:
		return fmt.Errorf("broker at %s rejected the credentials (check --user and its password, or --token): %w", addr, err)
	case errors.As(err, &be):
		return fmt.Errorf("broker at %s: %w", addr, err)
	case errors.Is(err, context.Canceled):
		return err
	case sinew.IsRetryable(err) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("broker at %s unreachable (is sinew serve running with listen there?): %w", addr, err)
	}
	return fmt.Errorf("broker at %s: %w", addr, err)
}

// headerFlag collects repeated --header k=v.
type headerFlag []sinew.Header

func (h *headerFlag) String() string { return fmt.Sprint(*h) }
func (h *headerFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("header %q is not key=value", v)
	}
	*h = append(*h, sinew.Header{Key: k, Value: val})
	return nil
}

type publishResultJSON struct {
	Seq       uint64 `json:"seq"`
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
}

func runPublish(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("publish", stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, publishHelp)
		fs.PrintDefaults()
	}
	cf := addClientFlags(fs)
	topic := fs.String("topic", "", "queue topic (required)")
	group := fs.String("group", "", "queue group")
	key := fs.String("key", "", "partition key")
	var headers headerFlag
	fs.Var(&headers, "header", "message header `key=value` (repeatable)")
	delay := fs.Duration("delay", 0, "deliver no earlier than this after publishing")
	ttl := fs.Duration("ttl", 0, "dead-letter the message if not delivered within this")
	window := fs.Int("window", 64, "confirms in flight (1 to 65536)")
	noConfirm := fs.Bool("no-confirm", false, "do not wait for confirms (nothing says the messages are durable)")
	asJSON := fs.Bool("json", false, `print {"seq":n,"partition":p,"offset":o} per confirmed message; the summary goes to stderr`)
	count := fs.Int("count", 0, "publish this many generated messages instead of reading stdin (at most 2147483647)")
	size := fs.Int("size", 64, "generated body size in `bytes`, at most 1048576 (bodies start with \"seq=<n> \")")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *topic == "":
		return fmt.Errorf("%w: --topic is required", errUsage)
	case *delay < 0 || *ttl < 0:
		return fmt.Errorf("%w: --delay and --ttl must not be negative", errUsage)
	case *noConfirm && *asJSON:
		return fmt.Errorf("%w: --json needs confirms; drop --no-confirm", errUsage)
	}
	if err := errors.Join(
		checkRange("window", int64(*window), 1, publishWindowMax),
		checkRange("count", int64(*count), 0, math.MaxInt32),
		checkRange("size", int64(*size), 0, publishBodyBytesMax),
		checkAddrs(*cf.addr),
	); err != nil {
		return err
	}
	var opts []sinew.PublishOption
	if *group != "" {
		opts = append(opts, sinew.WithGroup(*group))
	}
	if *key != "" {
		opts = append(opts, sinew.WithKey([]byte(*key)))
	}
	if len(headers) > 0 {
		opts = append(opts, sinew.WithHeaders(headers...))
	}
	if *delay > 0 {
		opts = append(opts, sinew.WithDelay(*delay))
	}
	if *ttl > 0 {
		opts = append(opts, sinew.WithTTL(*ttl))
	}

	var confirmed, failed int
	var sent uint64
	// writeSummary prints the one-line summary every run ends with once its
	// flags are valid, even when nothing could be sent.
	writeSummary := func() error {
		summary := fmt.Sprintf("published to %s: confirmed %d, failed %d\n", *topic, confirmed, failed)
		if *noConfirm {
			summary = fmt.Sprintf("published to %s: sent %d unconfirmed, failed %d\n", *topic, sent, failed)
		}
		w := stdout
		if *asJSON {
			w = stderr // stdout holds only JSON lines
		}
		_, err := io.WriteString(w, summary)
		return err
	}
	c, err := cf.dial(ctx, "sinew-publish", stderr)
	if err != nil {
		return errors.Join(writeSummary(), err)
	}
	defer c.Close()

	next := bodySource(stdin, *count, *size)
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)

	type inflight struct {
		seq uint64
		f   *sinew.PublishFuture
	}
	queue := make([]inflight, 0, *window)
	// firstErr stops reading input; the messages in flight are still waited
	// for, so the summary counts every message sent.
	var firstErr error
	fail := func(err error) {
		failed++
		if firstErr == nil {
			firstErr = err
		}
	}
	// settle waits for the oldest publish, so results print in seq order. It
	// returns only an error writing the output.
	settle := func() error {
		head := queue[0]
		queue = queue[1:]
		r, err := head.f.Wait(ctx)
		if err != nil {
			fail(fmt.Errorf("message %d: %w", head.seq, describeClientErr(*cf.addr, err)))
			return nil
		}
		confirmed++
		if *asJSON {
			return enc.Encode(publishResultJSON{Seq: head.seq, Partition: r.Partition, Offset: r.Offset})
		}
		return nil
	}
	var seq uint64
	for firstErr == nil {
		body, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			firstErr = err
			break
		}
		seq++
		if *noConfirm {
			if err := c.PublishNoConfirm(ctx, *topic, body, opts...); err != nil {
				fail(fmt.Errorf("message %d: %w", seq, describeClientErr(*cf.addr, err)))
				continue
			}
			sent++
			continue
		}
		if len(queue) == *window {
			if err := settle(); err != nil {
				return err
			}
		}
		queue = append(queue, inflight{seq, c.PublishAsync(ctx, *topic, body, opts...)})
	}
	for len(queue) > 0 {
		if err := settle(); err != nil {
			return err
		}
	}
	if err := out.Flush(); err != nil {
		return err
	}
	if err := writeSummary(); err != nil {
		return err
	}
	return firstErr
}

// errLineTooLong reports a stdin line over publishBodyBytesMax.
var errLineTooLong = errors.New("line too long")

// bodySource returns a function yielding message bodies: count generated ones
// when count > 0, else one per stdin line (without its line ending). It
// returns io.EOF at the end.
func bodySource(stdin io.Reader, count, size int) func() ([]byte, error) {
	if count > 0 {
		n := 0
		return func() ([]byte, error) {
			if n == count {
				return nil, io.EOF
			}
			n++
			b := strconv.AppendInt([]byte("seq="), int64(n), 10)
			b = append(b, ' ')
			if len(b) < size {
				b = append(b, bytes.Repeat([]byte{'x'}, size-len(b))...)
			}
			return b, nil
		}
	}
	sc := bufio.NewScanner(stdin)
	// Room for a full-size body and its line ending ("\r\n"), so the limit
	// below is exact whatever the line ending.
	sc.Buffer(make([]byte, 64<<10), publishBodyBytesMax+2)
	line := 0
	tooLong := func() error {
		return fmt.Errorf("stdin line %d: %w: more than %d bytes, the body limit; it and the lines after it were not published",
			line, errLineTooLong, publishBodyBytesMax)
	}
	return func() ([]byte, error) {
		line++
		if !sc.Scan() {
			if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
				return nil, tooLong()
			} else if err != nil {
				return nil, fmt.Errorf("reading stdin: %w", err)
			}
			return nil, io.EOF
		}
		body := bytes.TrimSuffix(sc.Bytes(), []byte{'\r'})
		if len(body) > publishBodyBytesMax {
			return nil, tooLong()
		}
		return append([]byte(nil), body...), nil
	}
}

// checkAddrs is clientAddrs's check alone.
func checkAddrs(flagValue string) error {
	_, err := clientAddrs(flagValue)
	return err
}

// checkHostPort refuses an address that cannot be dialled at all (no
// port, a port out of range) as a usage error, before any connect attempt
// is made and retried.
func checkHostPort(flagName, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: %s %q is not host:port: %v", errUsage, flagName, addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%w: %s %q: the port must be a number from 1 to 65535", errUsage, flagName, addr)
	}
	return nil
}

// connectAttemptFailed begins the message the client logs for each failed
// connect attempt.
const connectAttemptFailed = "sinew: connect attempt failed"

// quietConnectHandler logs the client's failed connect attempts at debug
// level instead of warn, so that without --verbose an unreachable broker
// costs one error line (dial's), not a warning per attempt before it.
type quietConnectHandler struct{ slog.Handler }

// Handle implements slog.Handler.
func (h quietConnectHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, connectAttemptFailed) && r.Level > slog.LevelDebug {
		if !h.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h quietConnectHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return quietConnectHandler{h.Handler.WithAttrs(as)}
}

// WithGroup implements slog.Handler.
func (h quietConnectHandler) WithGroup(name string) slog.Handler {
	return quietConnectHandler{h.Handler.WithGroup(name)}
}
