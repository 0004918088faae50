package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"
)

// `sinew admin` talks to the broker's admin HTTP API (docs/operations.md): the
// operator's view of queues, sessions, messages, dead letters, settings and
// drain. Every leaf command takes the same connection and output flags
// (--admin-addr, --timeout, --json), prints a table by default and the API's
// JSON with --json, and ends with one line on stderr when it fails.

const (
	// adminAddrDefault is where `sinew serve` serves the admin API unless
	// told otherwise (admin_listen).
	adminAddrDefault = "127.0.0.1:7655"
	// adminTimeoutDefault bounds one admin request, connect included.
	adminTimeoutDefault = 10 * time.Second
	// adminResponseBytesMax bounds an admin answer read into memory. The
	// largest the API sends is a messages page: 100 messages with a 64 KiB
	// preview each, as base64 and as escaped text.
	adminResponseBytesMax = 64 << 20
	// adminErrorBytesMax bounds how much of a non-JSON error answer is quoted.
	adminErrorBytesMax = 512
)

func init() {
	commands["admin"] = command{
		summary: "operate a broker over its admin API: queues, cohorts, sessions, messages, dlq, settings, drain, users, nodes, partition moves",
		run:     runAdmin,
	}
}

// adminCommand is one `sinew admin` command; verbs, when set, are its
// subcommands (queue show, dlq replay...).
type adminCommand struct {
	summary string
	run     func(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error
	verbs   map[string]adminCommand
}

// adminCommands is filled in by init in admin_cmds.go.
var adminCommands = map[string]adminCommand{}

func runAdmin(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "user" {
		// The user verbs read a new password from standard input.
		return dispatchAdmin(ctx, "admin user", userCommands(stdin), args[1:], stdout, stderr)
	}
	return dispatchAdmin(ctx, "admin", adminCommands, args, stdout, stderr)
}

// dispatchAdmin picks the command (or verb) named by args[0] from cmds.
func dispatchAdmin(ctx context.Context, prefix string, cmds map[string]adminCommand, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		adminUsage(stderr, prefix, cmds)
		if len(args) == 0 {
			return fmt.Errorf("%w: missing command (see the list above)", errUsage)
		}
		return flag.ErrHelp
	}
	c, ok := cmds[args[0]]
	if !ok {
		adminUsage(stderr, prefix, cmds)
		return fmt.Errorf("%w: unknown command %q for sinew %s", errUsage, args[0], prefix)
	}
	name := prefix + " " + args[0]
	if c.verbs != nil {
		return dispatchAdmin(ctx, name, c.verbs, args[1:], stdout, stderr)
	}
	return c.run(ctx, name, args[1:], stdout, stderr)
}

func adminUsage(w io.Writer, prefix string, cmds map[string]adminCommand) {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: sinew %s <command> [flags]\n\ncommands:\n", prefix)
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "  %-12s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintf(&b, "\nEvery command takes --admin-addr host:port (env SINEW_ADMIN_ADDR, default %s),\n"+
		"--timeout, --json, and --user (password in SINEW_PASSWORD or --password-file) or --token (env SINEW_TOKEN)\nfor a broker "+
		"that asks for credentials; run a command with --help for its own flags.\n", adminAddrDefault)
	io.WriteString(w, b.String())
}

// adminFlags are the flags every admin command takes.
type adminFlags struct {
	addr    *string
	timeout *time.Duration
	json    *bool
	user    *string // basic auth user; the password comes from SINEW_PASSWORD or passwordFile
	token   *string // bearer token
	// passwordFile holds the user's password on its first line.
	passwordFile *string
	tls          tlsFlags
}

func addAdminFlags(fs *flag.FlagSet) adminFlags {
	addr := os.Getenv("SINEW_ADMIN_ADDR")
	if addr == "" {
		addr = adminAddrDefault
	}
	return adminFlags{
		addr:    fs.String("admin-addr", addr, "admin API address `host:port` or http(s) URL (env SINEW_ADMIN_ADDR)"),
		timeout: fs.Duration("timeout", adminTimeoutDefault, "give up one request after this long"),
		json:    fs.Bool("json", false, "print the API's JSON instead of a table"),
		user: fs.String("user", os.Getenv("SINEW_USER"),
			"authenticate as this user (env SINEW_USER); the password comes from env SINEW_PASSWORD or --password-file, never from the command line"),
		passwordFile: fs.String("password-file", "", "read the --user password from the first line of this `file`"),
		token:        fs.String("token", os.Getenv("SINEW_TOKEN"), "authenticate with this bearer token, one of the broker's auth.tokens (env SINEW_TOKEN)"),
		tls:          addTLSFlags(fs),
	}
}

// authorization returns the Authorization header the flags ask for ("" for
// none). The password is read from the environment or a file, never a flag,
// so it stays out of the process list and shell history.
func (f adminFlags) authorization() (string, error) {
	user, token := *f.user, *f.token
	switch {
	case user != "" && token != "":
		return "", fmt.Errorf("%w: give --user or --token, not both", errUsage)
	case user != "":
		password, err := userPassword(user, *f.passwordFile)
		if err != nil {
			return "", err
		}
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password)), nil
	case *f.passwordFile != "":
		return "", fmt.Errorf("%w: --password-file needs --user", errUsage)
	case token != "":
		return "Bearer " + token, nil
	}
	return "", nil
}

// client checks the flags and returns a client for the admin API.
func (f adminFlags) client() (*adminClient, error) {
	if *f.timeout <= 0 {
		return nil, fmt.Errorf("%w: --timeout must be positive", errUsage)
	}
	base := strings.TrimSuffix(*f.addr, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
		if f.tls.enabled() {
			base = "https://" + strings.TrimPrefix(base, "http://")
		}
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("%w: --admin-addr %q is not host:port or http(s)://host:port", errUsage, *f.addr)
	}
	if u.Scheme == "http" && f.tls.enabled() {
		return nil, fmt.Errorf("%w: --admin-addr %q is http:// but TLS flags are set: use https:// or a bare host:port", errUsage, *f.addr)
	}
	authz, err := f.authorization()
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: *f.timeout}
	if u.Scheme == "https" {
		// Without TLS flags an https:// address verifies against the
		// system roots, as any HTTPS client does.
		tcfg, err := f.tls.config()
		if err != nil {
			return nil, err
		}
		if tcfg != nil {
			hc.Transport = &http.Transport{TLSClientConfig: tcfg, TLSHandshakeTimeout: *f.timeout}
		}
	}
	return &adminClient{base: base, addr: *f.addr, authz: authz, http: hc}, nil
}

// parseArgs parses flags that may come before, between or after the
// positional arguments (Go's flag package stops at the first positional),
// and returns the positionals. A "--" ends the flags.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// A "--" that fs.Parse consumed leaves rest as all positionals.
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// noArgs is parseArgs for a command that takes no positional arguments.
func noArgs(fs *flag.FlagSet, args []string) error {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, pos[0])
	}
	return nil
}

// adminClient makes requests to the admin API.
type adminClient struct {
	base  string // scheme://host:port
	addr  string // as the user gave it, for messages
	authz string // Authorization header; "" sends none
	http  *http.Client
}

// apiError is a non-2xx answer of the admin API. Body is the error body as
// JSON when the API sent one (code, error and any extra fields, such as the
// current settings after a 409).
type apiError struct {
	addr    string
	status  int
	code    string
	message string
	body    json.RawMessage
}

func (e *apiError) Error() string {
	code := e.code
	if code == "" {
		code = strings.ToLower(strings.ReplaceAll(http.StatusText(e.status), " ", "_"))
	}
	msg := e.message
	if e.status == http.StatusUnauthorized {
		msg += " (pass --user with the password in SINEW_PASSWORD or --password-file, or --token / SINEW_TOKEN)"
	}
	if e.status == http.StatusNotFound && e.code == "" {
		// net/http's own 404: the path is not served at all.
		msg += " (this broker's admin API has no such endpoint; is it older than this sinew?)"
	}
	return fmt.Sprintf("admin API at %s: %s (HTTP %d): %s", e.addr, code, e.status, msg)
}

// do sends a request with an optional JSON body and decodes a 2xx JSON answer
// into out (when out is not nil). It returns the status. A non-2xx answer is
// an *apiError; a failure to reach the API is one error naming the address.
func (c *adminClient) do(ctx context.Context, method, path string, query url.Values, body, out any) (int, error) {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errUsage, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.authz != "" {
		req.Header.Set("Authorization", c.authz)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, c.describeTransportErr(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, adminResponseBytesMax+1))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("admin API at %s: reading the answer to %s %s: %w", c.addr, method, path, err)
	}
	if len(data) > adminResponseBytesMax {
		return resp.StatusCode, fmt.Errorf("admin API at %s: the answer to %s %s is over %d bytes", c.addr, method, path, adminResponseBytesMax)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		ae := &apiError{addr: c.addr, status: resp.StatusCode}
		var eb struct {
			Code  string `json:"code"`
			Error string `json:"error"`
		}
		if json.Unmarshal(data, &eb) == nil && eb.Error != "" {
			ae.code, ae.message, ae.body = eb.Code, eb.Error, data
		} else {
			msg := strings.TrimSpace(string(data))
			if len(msg) > adminErrorBytesMax {
				msg = msg[:adminErrorBytesMax] + "..."
			}
			ae.message = displayBytes([]byte(strings.Join(strings.Fields(msg), " ")))
		}
		return resp.StatusCode, ae
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("admin API at %s: the answer to %s %s is not the JSON expected: %v", c.addr, method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// describeTransportErr turns a failure to get any answer into one line.
func (c *adminClient) describeTransportErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return err
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("admin API at %s did not answer in time (--timeout): %v", c.addr, err)
	case strings.Contains(err.Error(), "malformed HTTP"):
		// net/http's words for an answer that is not HTTP: most often a
		// broker's client listener, which answers a request line with a
		// Sinew ERROR frame.
		return fmt.Errorf("%s answered in something other than HTTP: is it the broker's client port (listen)? The admin API is on admin_listen (default %s): pass --admin-addr (%v)", c.addr, adminAddrDefault, err)
	}
	return fmt.Errorf("admin API at %s unreachable (is sinew serve running with admin_listen there?): %v", c.addr, err)
}

// queuePath is the API path of a queue, its topic path-escaped.
func queuePath(topic string, rest ...string) string {
	p := "/api/v1/queues/" + url.PathEscape(topic)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

// groupQuery is the query naming a queue's group ("" = the default group).
func groupQuery(group string) url.Values {
	q := url.Values{}
	if group != "" {
		q.Set("group", group)
	}
	return q
}

// printRaw prints a decoded JSON answer as indented JSON (--json).
func printRaw(w io.Writer, raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		_, err = w.Write(raw)
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}
