package protocol

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestSpecListsEveryCodeAndOp keeps docs/protocol.md in step with the tables in
// this package: every op and error code must appear in the specification.
func TestSpecListsEveryCodeAndOp(t *testing.T) {
	spec, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(spec)
	for _, c := range Codes() {
		row := fmt.Sprintf("| %d | `%s` |", c, c)
		if !strings.Contains(doc, row) {
			t.Errorf("docs/protocol.md lacks error row %q", row)
		}
	}
	for op, name := range opNames {
		row := fmt.Sprintf("| 0x%02x | `%s` |", uint8(op), name)
		if !strings.Contains(doc, row) {
			t.Errorf("docs/protocol.md lacks op row %q", row)
		}
	}
}

// specSections splits docs/protocol.md into its "### " sections, keyed by heading.
func specSections(t *testing.T) map[string]string {
	t.Helper()
	spec, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var head string
	var body strings.Builder
	for _, line := range strings.Split(string(spec), "\n") {
		if strings.HasPrefix(line, "#") {
			if head != "" {
				out[head] = body.String()
			}
			head, body = line, strings.Builder{}
			continue
		}
		body.WriteString(line + "\n")
	}
	out[head] = body.String()
	return out
}

// section returns the one section whose heading starts with prefix.
func section(t *testing.T, secs map[string]string, prefix string) string {
	t.Helper()
	var found []string
	for h, b := range secs {
		if strings.HasPrefix(h, prefix) {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		t.Fatalf("docs/protocol.md: %d sections start with %q, want 1", len(found), prefix)
	}
	return found[0]
}

// fieldTables returns the rows (field, type) of every "| field | type | notes |"
// table in a section, in order.
func fieldTables(sec string) [][][2]string {
	var tables [][][2]string
	var cur [][2]string
	in := false
	for _, line := range strings.Split(sec, "\n") {
		if strings.HasPrefix(line, "| field | type |") {
			in, cur = true, nil
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			tables, in = append(tables, cur), false
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		cur = append(cur, [2]string{strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2])})
	}
	if in {
		tables = append(tables, cur)
	}
	return tables
}

// wireRows lists a body's fields as the spec's tables do: nested records
// flattened with a dot (resume.client_id), except sub views, which are one row.
func wireRows(t reflect.Type, prefix string) [][2]string {
	var rows [][2]string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if t == reflect.TypeOf(Settle{}) && f.Name == "Kind" {
			continue // the op code, carried in the header
		}
		name := prefix + snake(f.Name)
		var typ string
		switch f.Type.Kind() {
		case reflect.Uint64, reflect.Uint16:
			typ = "uvarint"
		case reflect.Int64:
			typ = "varint"
		case reflect.Uint32:
			typ = "u32"
		case reflect.Int32:
			typ = "i32"
		case reflect.Uint8:
			typ = "u8"
		case reflect.Bool:
			typ = "bool"
		case reflect.String:
			typ = "string"
		case reflect.Slice:
			typ = "list"
			if f.Type.Elem().Kind() == reflect.Uint8 {
				typ = "bytes"
			}
		case reflect.Struct:
			if f.Type == reflect.TypeOf(SubView{}) {
				typ = "sub_view"
				break
			}
			rows = append(rows, wireRows(f.Type, name+".")...)
			continue
		}
		rows = append(rows, [2]string{name, typ})
	}
	return rows
}

// TestSpecBodyTables checks every field table of section 5 against the Go
// encoder: the same fields, in wire order, with the same wire types.
func TestSpecBodyTables(t *testing.T) {
	secs := specSections(t)
	cases := []struct {
		heading string
		table   int
		body    any
	}{
		{"### 5.1 HELLO", 0, Hello{}},
		{"### 5.2 HELLO_OK", 0, HelloOK{}},
		{"### 5.4 ERROR", 0, ErrorBody{}},
		{"### 5.5 DECLARE_QUEUE", 0, DeclareQueue{}},
		{"### 5.6 PUBLISH", 0, Publish{}},
		{"### 5.6 PUBLISH", 1, PublishOK{}},
		{"### 5.6a ", 0, PurgeOK{}},
		{"### 5.7 SUBSCRIBE", 0, Subscribe{}},
		{"### 5.8 DELIVER", 0, Deliver{}},
		{"### 5.9 ACK", 0, Settle{}},
		{"### 5.9a EXTEND", 0, Extend{}},
		{"### 5.10 SUB_CLOSED", 0, SubClosed{}},
		{"### 5.11 RECONCILE", 0, ReconcileEntry{}},
		{"### 5.11b INFLIGHT", 0, InflightResult{}},
		{"### 5.12 GOING_AWAY", 0, GoingAway{}},
	}
	for _, c := range cases {
		tables := fieldTables(section(t, secs, c.heading))
		if c.table >= len(tables) {
			t.Errorf("%s: %d field tables, want table %d", c.heading, len(tables), c.table)
			continue
		}
		got := tables[c.table]
		want := wireRows(reflect.TypeOf(c.body), "")
		if len(got) != len(want) {
			t.Errorf("%s table %d: %d rows %v, encoder has %d fields %v", c.heading, c.table, len(got), got, len(want), want)
			continue
		}
		for i := range want {
			name, typ := got[i][0], got[i][1]
			if name != want[i][0] || !strings.HasPrefix(strings.Trim(typ, "`"), want[i][1]) {
				t.Errorf("%s table %d row %d: doc says %s %q, encoder has %s %s", c.heading, c.table, i, name, typ, want[i][0], want[i][1])
			}
		}
	}
}

// TestSpecProseBodies checks the bodies the spec describes in prose rather
// than a table: each field is named, in backticks, in its section.
func TestSpecProseBodies(t *testing.T) {
	secs := specSections(t)
	cases := []struct {
		heading string
		body    any
	}{
		{"### 5.5 DECLARE_QUEUE", DeclareOK{}},
		{"### 5.6a ", DeleteQueue{}},
		{"### 5.7 SUBSCRIBE", SubscribeOK{}},
		{"### 5.7 SUBSCRIBE", Unsubscribe{}},
		{"### 5.9 ACK", LeaseRef{}},
		{"### 5.11 RECONCILE", Reconcile{}},
		{"### 5.11 RECONCILE", SubView{}},
		{"### 5.11b INFLIGHT", InflightEntry{}},
	}
	for _, c := range cases {
		sec := section(t, secs, c.heading)
		for _, row := range wireRows(reflect.TypeOf(c.body), "") {
			name := row[0]
			if i := strings.IndexByte(name, '.'); i >= 0 {
				name = name[:i] // InflightEntry.lease is described as a lease_ref
			}
			if name == "lease" {
				name = "lease_ref"
			}
			if !strings.Contains(sec, "`"+name+"`") {
				t.Errorf("%s does not name %T field `%s`", c.heading, c.body, name)
			}
		}
	}
}
