package settings

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the generated table in docs/configuration.md")

const (
	configDoc   = "../../docs/configuration.md"
	tableBegin  = "<!-- keys:begin (generated: go test ./internal/settings -run TestConfigurationDoc -update) -->"
	tableEnd    = "<!-- keys:end -->"
	exampleOpen = "```toml\n"
)

// keyTable renders every key with its three spellings, default and meaning.
func keyTable() string {
	var b strings.Builder
	b.WriteString("| TOML key | Environment variable | Flag | Default | Meaning |\n|---|---|---|---|---|\n")
	d := Default()
	for _, f := range fields(&d) {
		def := get(f)
		if def == "" {
			def = "(empty)"
		} else {
			def = "`" + def + "`"
		}
		b.WriteString("| `" + f.key + "` | `" + EnvName(f.key) + "` | `--" + FlagName(f.key) + "` | " + def + " | " + Describe(f.key) + " |\n")
	}
	return b.String()
}

func TestEveryKeyDescribed(t *testing.T) {
	for _, k := range Keys() {
		if Describe(k) == "" {
			t.Errorf("key %s has no description in help", k)
		}
	}
	if len(help) != len(Keys()) {
		t.Errorf("help has %d entries for %d keys: remove stale ones", len(help), len(Keys()))
	}
}

// TestConfigurationDoc keeps docs/configuration.md in step with the keys: the
// table between the markers must be exactly what keyTable renders (-update
// rewrites it), and the example file must load.
func TestConfigurationDoc(t *testing.T) {
	raw, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, tableBegin), strings.Index(doc, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s: table markers missing", configDoc)
	}
	want := keyTable()
	if got := doc[i+len(tableBegin)+1 : j]; got != want {
		if !*update {
			t.Fatalf("%s: the key table is out of date; run go test ./internal/settings -run TestConfigurationDoc -update\nwant:\n%s", configDoc, want)
		}
		doc = doc[:i+len(tableBegin)+1] + want + doc[j:]
		if err := os.WriteFile(configDoc, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range Keys() {
		if !strings.Contains(doc, "`"+k+"`") {
			t.Errorf("%s does not mention key %s", configDoc, k)
		}
	}
	k := strings.Index(doc, exampleOpen)
	if k < 0 {
		t.Fatalf("%s: no example TOML file", configDoc)
	}
	example := doc[k+len(exampleOpen):]
	example = example[:strings.Index(example, "```")]
	p := filepath.Join(t.TempDir(), "sinew.toml")
	if err := os.WriteFile(p, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(Sources{File: p}); err != nil {
		t.Fatalf("the example in %s does not load: %v", configDoc, err)
	}
}
