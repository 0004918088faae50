package cdp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoBrowser is returned by Find when no Chromium is installed.
var ErrNoBrowser = errors.New("cdp: no Chromium found (set SINEW_CHROMIUM, or run scripts/install-chromium to install Debian's chromium)")

// Limits. A reply or event larger than messageBytesMax (a screenshot of a
// large page is the biggest) ends the connection; consoleEntriesMax bounds
// what a Page records; closeWaitMs bounds how long Close waits for Chromium
// to exit before killing it.
const (
	messageBytesMax   = 64 << 20
	consoleEntriesMax = 1000
	closeWaitMs       = 5_000
)

// Find returns the path of a Chromium binary: $SINEW_CHROMIUM when set, else
// the first of chromium, chromium-browser and google-chrome on PATH.
func Find() (string, error) {
	if p := os.Getenv("SINEW_CHROMIUM"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("cdp: SINEW_CHROMIUM=%s: %w", p, err)
		}
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", ErrNoBrowser
}

// Flags are the command-line flags every launch uses: headless, no sandbox
// (tests often run as root), and nothing that reaches the network by itself.
var Flags = []string{
	"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
	"--disable-background-networking", "--disable-component-update", "--disable-sync",
	"--disable-extensions", "--disable-default-apps", "--mute-audio",
	"--disable-dev-shm-usage", "--window-size=1280,1000", "--remote-debugging-pipe",
}

// Browser is a running Chromium under this package's control.
type Browser struct {
	cmd    *exec.Cmd
	toB    *os.File // our end of Chromium's fd 3
	fromB  *os.File // our end of Chromium's fd 4
	exited chan struct{}

	wmu sync.Mutex // serialises writes to toB

	// mu guards the fields below. Lock order: Browser.mu before Page.mu (the
	// reader records a page's events while holding mu).
	mu      sync.Mutex
	nextID  int64
	pending map[int64]chan reply
	pages   map[string]*Page // by session id
	readErr error            // why the reader stopped; set once
	stopped chan struct{}    // closed when the reader stops
}

type reply struct {
	Result json.RawMessage
	Err    *rpcError
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    string `json:"data"`
}

func (e *rpcError) Error() string {
	if e.Data != "" {
		return fmt.Sprintf("cdp error %d: %s (%s)", e.Code, e.Message, e.Data)
	}
	return fmt.Sprintf("cdp error %d: %s", e.Code, e.Message)
}

// message is any message from Chromium: a reply has an ID, an event a Method.
type message struct {
	ID        int64           `json:"id"`
	Method    string          `json:"method"`
	Params    json.RawMessage `json:"params"`
	Result    json.RawMessage `json:"result"`
	Error     *rpcError       `json:"error"`
	SessionID string          `json:"sessionId"`
}

// Launch starts Chromium at path with a fresh profile in userDataDir (which
// must exist and be empty or Chromium's own) and Flags. Chromium's stderr goes
// to logw when it is not nil.
func Launch(path, userDataDir string, logw io.Writer) (*Browser, error) {
	// Chromium reads commands on fd 3 and writes on fd 4.
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	args := append(append([]string{}, Flags...), "--user-data-dir="+userDataDir, "about:blank")
	cmd := exec.Command(path, args...)
	cmd.ExtraFiles = []*os.File{inR, outW}
	cmd.Stdout = logw
	cmd.Stderr = logw
	// Its own process group, so Close can end Chromium's helper processes too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("cdp: start %s: %w", path, err)
	}
	inR.Close()
	outW.Close()
	b := &Browser{
		cmd: cmd, toB: inW, fromB: outR, exited: make(chan struct{}),
		pending: map[int64]chan reply{}, pages: map[string]*Page{}, stopped: make(chan struct{}),
	}
	go func() {
		cmd.Wait()
		close(b.exited)
	}()
	go b.read()
	return b, nil
}

// read decodes messages until the pipe closes, then fails every pending call.
func (b *Browser) read() {
	br := bufio.NewReaderSize(b.fromB, 1<<20)
	var err error
	for {
		var data []byte
		data, err = readMessage(br)
		if err != nil {
			break
		}
		var m message
		if err = json.Unmarshal(data, &m); err != nil {
			err = fmt.Errorf("cdp: malformed message from Chromium: %w", err)
			break
		}
		b.dispatch(&m)
	}
	b.mu.Lock()
	if errors.Is(err, io.EOF) {
		err = errors.New("cdp: Chromium closed its pipe (it exited)")
	}
	b.readErr = err
	for id, ch := range b.pending {
		delete(b.pending, id)
		close(ch)
	}
	b.mu.Unlock()
	close(b.stopped)
}

// readMessage reads one NUL-terminated message, bounded by messageBytesMax.
func readMessage(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice(0)
		buf = append(buf, chunk...)
		if len(buf) > messageBytesMax {
			return nil, fmt.Errorf("cdp: message over %d bytes", messageBytesMax)
		}
		if err == nil {
			return buf[:len(buf)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

func (b *Browser) dispatch(m *message) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if m.ID != 0 {
		if ch, ok := b.pending[m.ID]; ok {
			delete(b.pending, m.ID)
			ch <- reply{Result: m.Result, Err: m.Error}
		}
		return
	}
	if p := b.pages[m.SessionID]; p != nil {
		p.event(m.Method, m.Params)
	}
}

// Call sends method with params to the browser (sessionID "") or to an
// attached target, and decodes the result into out (which may be nil).
func (b *Browser) Call(ctx context.Context, sessionID, method string, params, out any) error {
	if params == nil {
		params = struct{}{}
	}
	ch := make(chan reply, 1)
	b.mu.Lock()
	if b.readErr != nil {
		err := b.readErr
		b.mu.Unlock()
		return err
	}
	b.nextID++
	id := b.nextID
	b.pending[id] = ch
	b.mu.Unlock()
	req := struct {
		ID        int64  `json:"id"`
		Method    string `json:"method"`
		Params    any    `json:"params"`
		SessionID string `json:"sessionId,omitempty"`
	}{id, method, params, sessionID}
	data, err := json.Marshal(req)
	if err != nil {
		b.forget(id)
		return err
	}
	b.wmu.Lock()
	_, err = b.toB.Write(append(data, 0))
	b.wmu.Unlock()
	if err != nil {
		b.forget(id)
		return fmt.Errorf("cdp: %s: write: %w", method, err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			b.mu.Lock()
			err := b.readErr
			b.mu.Unlock()
			return fmt.Errorf("cdp: %s: %w", method, err)
		}
		if r.Err != nil {
			return fmt.Errorf("%s: %w", method, r.Err)
		}
		if out != nil {
			return json.Unmarshal(r.Result, out)
		}
		return nil
	case <-ctx.Done():
		b.forget(id)
		return fmt.Errorf("cdp: %s: %w", method, ctx.Err())
	}
}

func (b *Browser) forget(id int64) {
	b.mu.Lock()
	delete(b.pending, id)
	b.mu.Unlock()
}

// Close asks Chromium to exit and waits for it, bounded by closeWaitMs; past
// that it kills the browser's process group.
func (b *Browser) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), closeWaitMs*time.Millisecond)
	defer cancel()
	b.Call(ctx, "", "Browser.close", nil, nil)
	select {
	case <-b.exited:
	case <-ctx.Done():
		// Negative pid: the group Launch created, and only it.
		syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		<-b.exited
	}
	b.toB.Close()
	<-b.stopped
	b.fromB.Close()
	return nil
}

// ConsoleEntry is one thing a page reported that a test may care about.
type ConsoleEntry struct {
	// Source is "console", "exception" or "log" (the browser's own log, where
	// failed resource loads appear).
	Source string
	// Level is the console level ("error", "warning", "log", ...).
	Level string
	// Text is the message, with its location when Chromium gave one.
	Text string
}

// String is the entry as a test prints it: source, level and text.
func (c ConsoleEntry) String() string { return c.Source + " " + c.Level + ": " + c.Text }

// Page is one browser tab attached in flat session mode.
type Page struct {
	b         *Browser
	sessionID string

	mu      sync.Mutex
	entries []ConsoleEntry
	loads   chan struct{} // one value per Page.loadEventFired, never blocks the reader
}

// NewPage opens a blank tab and enables the domains the page helpers need.
func (b *Browser) NewPage(ctx context.Context) (*Page, error) {
	var created struct {
		TargetID string `json:"targetId"`
	}
	if err := b.Call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &created); err != nil {
		return nil, err
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.Call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": created.TargetID, "flatten": true}, &attached); err != nil {
		return nil, err
	}
	p := &Page{b: b, sessionID: attached.SessionID, loads: make(chan struct{}, 16)}
	b.mu.Lock()
	b.pages[p.sessionID] = p
	b.mu.Unlock()
	for _, domain := range []string{"Page.enable", "Runtime.enable", "Log.enable"} {
		if err := p.Call(ctx, domain, nil, nil); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Call sends a command to this page's session.
func (p *Page) Call(ctx context.Context, method string, params, out any) error {
	return p.b.Call(ctx, p.sessionID, method, params, out)
}

// event runs on the reader goroutine with b.mu held: it only records.
func (p *Page) event(method string, params json.RawMessage) {
	switch method {
	case "Page.loadEventFired":
		select {
		case p.loads <- struct{}{}:
		default:
		}
	case "Runtime.consoleAPICalled":
		var ev struct {
			Type string `json:"type"`
			Args []struct {
				Value       any    `json:"value"`
				Description string `json:"description"`
			} `json:"args"`
		}
		if json.Unmarshal(params, &ev) != nil {
			return
		}
		var parts []string
		for _, a := range ev.Args {
			if a.Description != "" {
				parts = append(parts, a.Description)
			} else {
				parts = append(parts, fmt.Sprint(a.Value))
			}
		}
		p.record(ConsoleEntry{Source: "console", Level: ev.Type, Text: strings.Join(parts, " ")})
	case "Runtime.exceptionThrown":
		var ev struct {
			Details struct {
				Text      string `json:"text"`
				URL       string `json:"url"`
				Line      int    `json:"lineNumber"`
				Exception struct {
					Description string `json:"description"`
				} `json:"exception"`
			} `json:"exceptionDetails"`
		}
		if json.Unmarshal(params, &ev) != nil {
			return
		}
		d := ev.Details
		p.record(ConsoleEntry{Source: "exception", Level: "error", Text: fmt.Sprintf("%s %s (%s:%d)", d.Text, d.Exception.Description, d.URL, d.Line+1)})
	case "Log.entryAdded":
		var ev struct {
			Entry struct {
				Level string `json:"level"`
				Text  string `json:"text"`
				URL   string `json:"url"`
			} `json:"entry"`
		}
		if json.Unmarshal(params, &ev) != nil {
			return
		}
		text := ev.Entry.Text
		if ev.Entry.URL != "" {
			text += " (" + ev.Entry.URL + ")"
		}
		p.record(ConsoleEntry{Source: "log", Level: ev.Entry.Level, Text: text})
	}
}

func (p *Page) record(e ConsoleEntry) {
	p.mu.Lock()
	if len(p.entries) < consoleEntriesMax {
		p.entries = append(p.entries, e)
	}
	p.mu.Unlock()
}

// Console returns everything the page reported so far.
func (p *Page) Console() []ConsoleEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]ConsoleEntry(nil), p.entries...)
}

// Errors returns the console errors, uncaught exceptions and browser log
// errors the page reported so far.
func (p *Page) Errors() []ConsoleEntry {
	var out []ConsoleEntry
	for _, e := range p.Console() {
		if e.Level == "error" || e.Level == "assert" {
			out = append(out, e)
		}
	}
	return out
}

// Navigate loads url and waits for its load event.
func (p *Page) Navigate(ctx context.Context, url string) error {
	// Drain load events of earlier navigations.
	for len(p.loads) > 0 {
		<-p.loads
	}
	var res struct {
		ErrorText string `json:"errorText"`
	}
	if err := p.Call(ctx, "Page.navigate", map[string]any{"url": url}, &res); err != nil {
		return err
	}
	if res.ErrorText != "" {
		return fmt.Errorf("cdp: navigate %s: %s", url, res.ErrorText)
	}
	select {
	case <-p.loads:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("cdp: navigate %s: no load event: %w", url, ctx.Err())
	}
}

// Eval evaluates a JavaScript expression in the page, awaiting it when it is
// a promise, and decodes its JSON value into out (which may be nil). A thrown
// exception or rejected promise is an error.
func (p *Page) Eval(ctx context.Context, expr string, out any) error {
	var res struct {
		Result struct {
			Type  string          `json:"type"`
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	err := p.Call(ctx, "Runtime.evaluate", map[string]any{
		"expression": expr, "returnByValue": true, "awaitPromise": true, "userGesture": true,
	}, &res)
	if err != nil {
		return err
	}
	if res.Exception != nil {
		return fmt.Errorf("cdp: eval: %s %s", res.Exception.Text, res.Exception.Exception.Description)
	}
	if out != nil && len(res.Result.Value) > 0 {
		return json.Unmarshal(res.Result.Value, out)
	}
	return nil
}

// WaitFor waits until the JavaScript expression cond is truthy in the page,
// for at most timeoutMs (and ctx). The page checks it itself, every 50 ms,
// so the wait ends as soon as the condition holds; on timeout the error
// says what was awaited.
func (p *Page) WaitFor(ctx context.Context, what, cond string, timeoutMs int) error {
	whatJSON, _ := json.Marshal(what)
	// cond is pasted in as code, not passed to eval: a page's CSP may forbid
	// eval, while Runtime.evaluate itself is always allowed.
	expr := fmt.Sprintf(`new Promise((resolve, reject) => {
  const cond = () => (%s
  );
  const deadline = Date.now() + %d;
  const check = () => {
    let ok = false, why = "";
    try { ok = !!cond(); } catch (e) { why = String(e); }
    if (ok) { resolve(true); return; }
    if (Date.now() > deadline) { reject(new Error("timed out waiting for " + %s + (why ? ": " + why : ""))); return; }
    setTimeout(check, 50);
  };
  check();
})`, cond, timeoutMs, whatJSON)
	return p.Eval(ctx, expr, nil)
}

// Screenshot captures the page (its full height) as PNG into path.
func (p *Page) Screenshot(ctx context.Context, path string) error {
	var res struct {
		Data string `json:"data"`
	}
	if err := p.Call(ctx, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &res); err != nil {
		return err
	}
	png, err := base64.StdEncoding.DecodeString(res.Data)
	if err != nil {
		return fmt.Errorf("cdp: screenshot: %w", err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG")) {
		return errors.New("cdp: screenshot is not a PNG")
	}
	return os.WriteFile(path, png, 0o644)
}
