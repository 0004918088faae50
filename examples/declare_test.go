package examples

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestOrdersDeclaredAlike checks that every example that declares the queue
// "orders" (the Go publish and worker examples, the TypeScript README)
// declares it alike. They are meant to run against one broker in any order,
// and a second declaration with another partition count is refused with
// conflict, while other differences silently change the queue's policy.
func TestOrdersDeclaredAlike(t *testing.T) {
	type decl struct {
		where               string
		partitions, retries int
		deadLetterTopic     string
	}
	var decls []decl
	for _, path := range []string{"publish/main.go", "worker/main.go"} {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 3 {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "DeclareQueue" {
				return true
			}
			if lit, ok := call.Args[1].(*ast.BasicLit); !ok || lit.Value != `"orders"` {
				return true
			}
			d := decl{where: path}
			cfg, ok := call.Args[2].(*ast.CompositeLit)
			if !ok {
				t.Fatalf("%s: the config of orders is not a literal", path)
			}
			for _, e := range cfg.Elts {
				kv := e.(*ast.KeyValueExpr)
				val, _ := kv.Value.(*ast.BasicLit)
				switch kv.Key.(*ast.Ident).Name {
				case "Partitions":
					d.partitions, _ = strconv.Atoi(val.Value)
				case "MaxRetries":
					d.retries, _ = strconv.Atoi(val.Value)
				case "DeadLetterTopic":
					d.deadLetterTopic, _ = strconv.Unquote(val.Value)
				}
			}
			decls = append(decls, d)
			return true
		})
	}
	readme, err := os.ReadFile("../clients/typescript/README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`declareQueue\("orders", \{([^}]*)\}`).FindAllSubmatch(readme, -1) {
		d := decl{where: "clients/typescript/README.md"}
		field := func(name string) string {
			f := regexp.MustCompile(name + `: "?([^",}]+)"?`).FindSubmatch(m[1])
			if f == nil {
				return ""
			}
			return strings.TrimSpace(string(f[1]))
		}
		d.partitions, _ = strconv.Atoi(field("partitions"))
		d.retries, _ = strconv.Atoi(field("maxRetries"))
		d.deadLetterTopic = field("deadLetterTarget")
		decls = append(decls, d)
	}
	if len(decls) != 3 {
		t.Fatalf("found %d declarations of orders, want 3: %+v", len(decls), decls)
	}
	for _, d := range decls[1:] {
		if d.partitions != decls[0].partitions || d.retries != decls[0].retries || d.deadLetterTopic != decls[0].deadLetterTopic {
			t.Errorf("%s declares orders as %+v, %s as %+v", decls[0].where, decls[0], d.where, d)
		}
	}
}
