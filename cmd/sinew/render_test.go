package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

func TestDisplayBytesIsLossless(t *testing.T) {
	for _, in := range []string{"", "plain text", "wörld ✓", "\x00\xff", "tab\there", "line\n", `"quoted"`, "\xe2\x28\xa1", "\u202e"} {
		got := displayBytes([]byte(in))
		if isPlainText([]byte(in)) && (in == "" || in[0] != '"') {
			if got != in {
				t.Errorf("%q shown as %q; plain text is shown as it is", in, got)
			}
			continue
		}
		back, err := strconv.Unquote(got)
		if err != nil || back != in {
			t.Errorf("%q shown as %q, which reads back as %q (%v)", in, got, back, err)
		}
		if strings.ContainsAny(got, "\n\t\x00") {
			t.Errorf("%q shown as %q, with a raw control character", in, got)
		}
	}
	if got := displayBody([]byte("hi"), "base64"); got != "aGk=" {
		t.Errorf("base64 body %q", got)
	}
	if got := displayBody([]byte("hi"), "escaped"); got != `"hi"` {
		t.Errorf("escaped body %q", got)
	}
}

func TestJSONBytesRoundTrip(t *testing.T) {
	for _, in := range []string{"", "text", "wörld", "\x00ctl\n", "\xff\xfe", "a\xc3"} {
		s, enc := jsonBytes([]byte(in))
		data, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var back string
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatal(err)
		}
		if enc == encodingBase64 {
			raw, err := base64.StdEncoding.DecodeString(back)
			if err != nil {
				t.Fatal(err)
			}
			back = string(raw)
		}
		if back != in {
			t.Errorf("%q came back as %q (encoding %s)", in, back, enc)
		}
	}
}

func TestTableCellsCannotBreakLayout(t *testing.T) {
	var buf bytes.Buffer
	tb := newTable(&buf, "A", "B")
	tb.row("x\ty", "")
	tb.row("line\nbreak", "ok")
	if err := tb.flush(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], `"x\ty"`) || !strings.HasSuffix(lines[1], "-") ||
		!strings.Contains(lines[2], `"line\nbreak"`) {
		t.Fatalf("table:\n%s", buf.String())
	}
}

func TestFormatBytes(t *testing.T) {
	for in, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 20: "5.0 MiB", 3 << 40: "3.0 TiB"} {
		if got := formatBytes(in); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}, {"-v"}} {
		code, out, errOut := runCmd(t, "", args...)
		if code != 0 || !strings.HasPrefix(out, "sinew 0.1 (go") || strings.Count(out, "\n") != 1 {
			t.Errorf("%v: exit %d, out %q, err %q", args, code, out, errOut)
		}
	}
	code, out, _ := runCmd(t, "", "version", "--json")
	var v versionInfo
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.Version != "0.1" || v.GoVersion == "" || v.Platform == "" {
		t.Fatalf("version --json: exit %d, %q, %v", code, out, err)
	}
	if code, _, _ := runCmd(t, "", "version", "extra"); code != 2 {
		t.Fatalf("version extra: exit %d, want 2", code)
	}
}
