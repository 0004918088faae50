package protocol

import (
	"fmt"
	"os"
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
