package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"
)

// Output helpers shared by the admin and client commands: tables for people,
// indented JSON for scripts, and byte strings (bodies, keys, header values)
// shown so that no byte is lost or changed.

// writeJSONOut prints v as indented JSON followed by a newline.
func writeJSONOut(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes aligned columns. Cells are made safe first (cellText), so a
// name holding a tab or a newline cannot break the layout.
type table struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer, headers ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	cells := make([]any, len(headers))
	for i, h := range headers {
		cells[i] = h
	}
	t.row(cells...)
	return t
}

// shown is a cell already made safe (its parts passed through displayBytes),
// which the table must not escape a second time.
type shown string

// row adds a row. A string cell is made safe with cellText; a shown cell is
// written as it is.
func (t *table) row(cells ...any) {
	for i, c := range cells {
		if i > 0 {
			io.WriteString(t.tw, "\t")
		}
		switch c := c.(type) {
		case shown:
			if c == "" {
				c = "-"
			}
			io.WriteString(t.tw, string(c))
		case string:
			io.WriteString(t.tw, cellText(c))
		default:
			io.WriteString(t.tw, cellText(fmt.Sprint(c)))
		}
	}
	io.WriteString(t.tw, "\n")
}

func (t *table) flush() error { return t.tw.Flush() }

// cellText returns s for a table cell: "-" for empty, and s escaped (as
// displayBytes does) when it holds anything but printable text.
func cellText(s string) string {
	if s == "" {
		return "-"
	}
	return displayBytes([]byte(s))
}

// isPlainText reports whether b is valid UTF-8 made only of printable
// characters and spaces (no tabs, newlines or other control characters), so
// printing it as it is shows exactly its bytes.
func isPlainText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if r != ' ' && !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// displayBytes shows b on one line for a person: as it is when it is plain
// text, else as a Go-quoted string ("a\x00b\n"), where every byte that is not
// printable UTF-8 is escaped. The quotes mark the escaped form, so the two can
// never be confused, and the quoted form reads back with strconv.Unquote.
func displayBytes(b []byte) string {
	if isPlainText(b) && !(len(b) > 0 && b[0] == '"') {
		return string(b)
	}
	return strconv.Quote(string(b))
}

// displayBody is displayBytes for a message body in the given format: auto
// (displayBytes), escaped (always quoted) or base64.
func displayBody(b []byte, format string) string {
	switch format {
	case "base64":
		return base64.StdEncoding.EncodeToString(b)
	case "escaped":
		return strconv.Quote(string(b))
	}
	return displayBytes(b)
}

// bodyFormats are the values of --body.
var bodyFormats = []string{"auto", "escaped", "base64"}

func checkBodyFormat(f string) error {
	for _, v := range bodyFormats {
		if f == v {
			return nil
		}
	}
	return fmt.Errorf("%w: --body %q: want one of %s", errUsage, f, strings.Join(bodyFormats, ", "))
}

// Encodings of a byte string in JSON output.
const (
	encodingUTF8   = "utf8"
	encodingBase64 = "base64"
)

// jsonBytes encodes b for a JSON string without loss: b itself when it is
// valid UTF-8 (JSON escapes its control characters), else base64. The second
// result names which.
func jsonBytes(b []byte) (string, string) {
	if utf8.Valid(b) {
		return string(b), encodingUTF8
	}
	return base64.StdEncoding.EncodeToString(b), encodingBase64
}

// formatBytes shows a byte count with a binary unit (1.5 KiB).
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// nBytes is "1 byte" or "N bytes".
func nBytes(n int64) string {
	if n == 1 {
		return "1 byte"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}
