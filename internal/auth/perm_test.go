package auth

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestPermissionsAllowsTable(t *testing.T) {
	p := Permissions{
		Publish: []string{"orders.*", "audit"},
		Consume: []string{"*"},
		Manage:  []string{"tmp*"},
	}
	for _, c := range []struct {
		a     Action
		topic string
		want  bool
	}{
		// Prefix pattern.
		{ActionPublish, "orders.eu", true},
		{ActionPublish, "orders.", true},
		{ActionPublish, "orders", false}, // "orders.*" needs the dot
		{ActionPublish, "ordersx", false},
		{ActionPublish, "xorders.eu", false},
		// Exact pattern.
		{ActionPublish, "audit", true},
		{ActionPublish, "audit.log", false},
		{ActionPublish, "audi", false},
		{ActionPublish, "AUDIT", false}, // case-sensitive
		// "*" is every topic.
		{ActionConsume, "anything", true},
		{ActionConsume, "orders.eu", true},
		// Prefix without a separator.
		{ActionManage, "tmp", true},
		{ActionManage, "tmpfoo", true},
		{ActionManage, "tm", false},
		{ActionManage, "orders.eu", false},
		// An unknown action is never allowed.
		{Action(0), "orders.eu", false},
		{Action(9), "anything", false},
	} {
		if got := p.Allows(c.a, c.topic); got != c.want {
			t.Errorf("Allows(%s, %q) = %v, want %v", c.a, c.topic, got, c.want)
		}
	}
	// The zero value denies everything.
	var zero Permissions
	for _, a := range Actions {
		if zero.Allows(a, "orders") || zero.Allows(a, "") {
			t.Errorf("zero Permissions allows %s", a)
		}
	}
	// A user principal follows its permissions; All overrides them.
	user := Principal{Kind: KindUser, Perms: p}
	if user.Allows(ActionManage, "orders.eu") || !user.Allows(ActionPublish, "orders.eu") {
		t.Error("user principal does not follow its permissions")
	}
	if !(Principal{Kind: KindToken, All: true}).Allows(ActionManage, "orders.eu") {
		t.Error("All does not override permissions")
	}
}

func TestPermissionsValidate(t *testing.T) {
	good := []string{"orders", "orders.*", "*", "a", "ü.*", strings.Repeat("x", 255) + "*", "a b"}
	for _, pat := range good {
		if err := (Permissions{Consume: []string{pat}}).Validate(); err != nil {
			t.Errorf("Validate(%q) = %v, want nil", pat, err)
		}
	}
	bad := []string{"", "or*ders", "**", "*.orders", "a/b", "a\x00", "a\nb", "\xff",
		strings.Repeat("x", PatternBytesMax+1)}
	for _, pat := range bad {
		for _, a := range Actions {
			var p Permissions
			*p.set(a) = []string{"ok", pat}
			err := p.Validate()
			if !errors.Is(err, ErrInvalidPattern) {
				t.Errorf("Validate(%s %q) = %v, want ErrInvalidPattern", a, pat, err)
				continue
			}
			// The error names the action, so an operator knows which
			// list to fix.
			if !strings.HasPrefix(err.Error(), a.String()+": ") {
				t.Errorf("Validate(%s %q) = %q, does not name the action", a, pat, err)
			}
		}
	}
}

func TestActionNames(t *testing.T) {
	for _, a := range Actions {
		got, err := ParseAction(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAction(%q) = %v, %v", a.String(), got, err)
		}
	}
	if _, err := ParseAction("admin"); !errors.Is(err, ErrInvalidPattern) {
		t.Errorf("ParseAction(admin) = %v", err)
	}
	if s := Action(7).String(); s != "action(7)" {
		t.Errorf("Action(7) = %q", s)
	}
}

func TestGrantRevoke(t *testing.T) {
	p := Permissions{Publish: []string{"a"}}
	q := p.Grant(Permissions{Publish: []string{"a", "b.*"}, Manage: []string{"c"}})
	if !slices.Equal(q.Publish, []string{"a", "b.*"}) || !slices.Equal(q.Manage, []string{"c"}) || len(q.Consume) != 0 {
		t.Fatalf("Grant = %+v", q)
	}
	if !slices.Equal(p.Publish, []string{"a"}) {
		t.Fatalf("Grant changed its receiver: %+v", p)
	}
	r := q.Revoke(Permissions{Publish: []string{"a"}, Manage: []string{"c"}})
	if !slices.Equal(r.Publish, []string{"b.*"}) || len(r.Manage) != 0 {
		t.Fatalf("Revoke = %+v", r)
	}
	if !slices.Equal(q.Publish, []string{"a", "b.*"}) {
		t.Fatalf("Revoke changed its receiver: %+v", q)
	}
	// Revoke removes patterns as written, not what they match.
	if got := (Permissions{Consume: []string{"orders.*"}}).Revoke(Permissions{Consume: []string{"orders.eu"}}); !got.Allows(ActionConsume, "orders.eu") {
		t.Fatalf("Revoke of an exact topic removed a prefix grant: %+v", got)
	}
	if !(Permissions{}).IsZero() || r.IsZero() {
		t.Fatal("IsZero")
	}
}

// genTopic draws topics from a small alphabet so prefixes collide often.
func genTopic() *rapid.Generator[string] {
	return rapid.StringOfN(rapid.SampledFrom([]rune("ab.")), 0, 6, -1)
}

// genPattern draws valid patterns: a topic, optionally with a trailing "*".
func genPattern() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		s := genTopic().Draw(t, "stem")
		if rapid.Bool().Draw(t, "wild") {
			return s + "*"
		}
		if s == "" {
			return "a"
		}
		return s
	})
}

func genPerms() *rapid.Generator[Permissions] {
	return rapid.Custom(func(t *rapid.T) Permissions {
		pats := rapid.SliceOfN(genPattern(), 0, 4)
		return Permissions{Publish: pats.Draw(t, "pub"), Consume: pats.Draw(t, "con"), Manage: pats.Draw(t, "man")}
	})
}

// TestPermissionsModel checks Allows against a plain model of the rule:
// an exact pattern equals the topic; a "*" pattern's stem is a prefix of it.
func TestPermissionsModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genPerms().Draw(t, "perms")
		if err := p.Validate(); err != nil {
			t.Fatalf("generated pattern invalid: %v", err)
		}
		a := rapid.SampledFrom(Actions).Draw(t, "action")
		topic := genTopic().Draw(t, "topic")
		want := false
		for _, pat := range p.For(a) {
			if pat[len(pat)-1] == '*' {
				stem := pat[:len(pat)-1]
				want = want || (len(topic) >= len(stem) && topic[:len(stem)] == stem)
			} else {
				want = want || pat == topic
			}
		}
		if got := p.Allows(a, topic); got != want {
			t.Fatalf("Allows(%s, %q) = %v, model %v (perms %+v)", a, topic, got, want, p)
		}
		// Grants on one action never leak into another.
		for _, b := range Actions {
			if b != a && (Permissions{}).Grant(onlyAction(p, a)).Allows(b, topic) {
				t.Fatalf("patterns of %s allowed %s", a, b)
			}
		}
	})
}

// TestGrantRevokeProperties: Grant only ever adds what was granted and
// keeps what was there; revoking exactly what was granted to an empty set
// leaves nothing.
func TestGrantRevokeProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genPerms().Draw(t, "p")
		q := genPerms().Draw(t, "q")
		a := rapid.SampledFrom(Actions).Draw(t, "action")
		topic := genTopic().Draw(t, "topic")
		g := p.Grant(q)
		if got, want := g.Allows(a, topic), p.Allows(a, topic) || q.Allows(a, topic); got != want {
			t.Fatalf("Grant: Allows = %v, want %v", got, want)
		}
		if q.Revoke(q).Allows(a, topic) {
			t.Fatalf("q.Revoke(q) still allows %s %q", a, topic)
		}
		// Revoke never grants.
		if g.Revoke(q).Allows(a, topic) && !p.Allows(a, topic) {
			t.Fatalf("Revoke granted %s %q", a, topic)
		}
	})
}

func onlyAction(p Permissions, a Action) Permissions {
	var out Permissions
	*out.set(a) = p.For(a)
	return out
}
