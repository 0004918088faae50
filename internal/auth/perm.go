package auth

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Action is what a request does to a topic, for permission checks.
type Action uint8

// The actions a permission can grant.
const (
	// ActionPublish covers PUBLISH.
	ActionPublish Action = iota + 1
	// ActionConsume covers SUBSCRIBE and reads (peek, browse, queue
	// inspection of messages); settles are covered by the lease they hold.
	ActionConsume
	// ActionManage covers DECLARE, PURGE, DELETE, dead-letter
	// replay/move/discard, creating a queue on first use (a PUBLISH or
	// SUBSCRIBE naming one that does not exist) and, with ActionPublish,
	// a PUBLISH to a Reserved topic.
	ActionManage
)

// Actions lists every action in order, for loops over all of them.
var Actions = []Action{ActionPublish, ActionConsume, ActionManage}

// String returns the action's name as it appears in permissions
// ("publish", "consume", "manage"), in errors and in logs.
func (a Action) String() string {
	switch a {
	case ActionPublish:
		return "publish"
	case ActionConsume:
		return "consume"
	case ActionManage:
		return "manage"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// ParseAction is the inverse of Action.String.
func ParseAction(s string) (Action, error) {
	for _, a := range Actions {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown action %q (want publish, consume or manage)", ErrInvalidPattern, s)
}

// ReservedTopicPrefix starts the names of the topics that belong to the
// broker: the global dead-letter queue ("sinew.dead-letter") lives there. A
// client publishes to one only with manage on it as well as publish; the
// broker's own copies (dead-lettering, replay) are not client requests.
const ReservedTopicPrefix = "sinew."

// Reserved reports whether topic belongs to the broker (ReservedTopicPrefix).
func Reserved(topic string) bool { return strings.HasPrefix(topic, ReservedTopicPrefix) }

// ErrInvalidPattern wraps every rejected topic pattern or action name.
var ErrInvalidPattern = errors.New("auth: invalid permission")

// PatternBytesMax is the longest topic pattern: the longest topic name
// (255 bytes) plus the trailing "*".
const PatternBytesMax = 256

// Permissions lists, per action, topic patterns. The matching rule:
//
//	pattern     matches
//	"orders"    the topic "orders" only
//	"orders.*"  every topic starting with "orders." ("orders.eu", "orders.")
//	"orders*"   every topic starting with "orders" ("orders", "ordersx")
//	"*"         every topic
//	(no pattern for an action) nothing: the zero Permissions denies all
//
// A "*" is a wildcard only as the last byte and is refused anywhere else,
// so a topic whose name contains '*' can be granted only through a prefix
// pattern that ends before it. Matching is byte-wise and case-sensitive,
// like topic names.
type Permissions struct {
	Publish []string `json:"publish"`
	Consume []string `json:"consume"`
	Manage  []string `json:"manage"`
}

// For returns the patterns p holds for a (nil for an unknown action).
func (p Permissions) For(a Action) []string {
	switch a {
	case ActionPublish:
		return p.Publish
	case ActionConsume:
		return p.Consume
	case ActionManage:
		return p.Manage
	}
	return nil
}

// set returns a pointer to the list for a, or nil for an unknown action.
func (p *Permissions) set(a Action) *[]string {
	switch a {
	case ActionPublish:
		return &p.Publish
	case ActionConsume:
		return &p.Consume
	case ActionManage:
		return &p.Manage
	}
	return nil
}

// Allows reports whether p grants a on topic.
func (p Permissions) Allows(a Action, topic string) bool {
	for _, pat := range p.For(a) {
		if Match(pat, topic) {
			return true
		}
	}
	return false
}

// Match reports whether one pattern matches topic, by the rule on
// Permissions.
func Match(pattern, topic string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(topic, prefix)
	}
	return pattern == topic
}

// ValidatePattern checks one topic pattern: 1..PatternBytesMax bytes of
// printable UTF-8 without '/' (what a topic name may hold), with '*' only
// as the last byte.
func ValidatePattern(pat string) error {
	switch {
	case pat == "":
		return fmt.Errorf("%w: empty topic pattern", ErrInvalidPattern)
	case len(pat) > PatternBytesMax:
		return fmt.Errorf("%w: topic pattern of %d bytes, at most %d", ErrInvalidPattern, len(pat), PatternBytesMax)
	case !utf8.ValidString(pat):
		return fmt.Errorf("%w: topic pattern %q is not valid UTF-8", ErrInvalidPattern, pat)
	case strings.ContainsRune(pat, '/'):
		return fmt.Errorf("%w: topic pattern %q contains '/'", ErrInvalidPattern, pat)
	}
	if i := strings.IndexByte(pat, '*'); i >= 0 && i != len(pat)-1 {
		return fmt.Errorf("%w: topic pattern %q: '*' only at the end", ErrInvalidPattern, pat)
	}
	for _, r := range pat {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: topic pattern %q contains the unprintable character %U", ErrInvalidPattern, pat, r)
		}
	}
	return nil
}

// Validate returns an error naming the first bad pattern and its action.
func (p Permissions) Validate() error {
	for _, a := range Actions {
		for _, pat := range p.For(a) {
			if err := ValidatePattern(pat); err != nil {
				return fmt.Errorf("%s: %w", a, err)
			}
		}
	}
	return nil
}

// Grant returns p with the patterns of q added (duplicates dropped, order
// kept). p and q are not changed.
func (p Permissions) Grant(q Permissions) Permissions {
	out := clonePerms(p)
	for _, a := range Actions {
		dst := out.set(a)
		for _, pat := range q.For(a) {
			if !slices.Contains(*dst, pat) {
				*dst = append(*dst, pat)
			}
		}
	}
	return out
}

// Revoke returns p without the patterns of q. It removes patterns as
// written, not what they match: revoking "orders.eu" from a user who holds
// "orders.*" leaves "orders.*". p and q are not changed.
func (p Permissions) Revoke(q Permissions) Permissions {
	out := clonePerms(p)
	for _, a := range Actions {
		dst := out.set(a)
		*dst = slices.DeleteFunc(*dst, func(pat string) bool { return slices.Contains(q.For(a), pat) })
	}
	return out
}

// IsZero reports whether p grants nothing.
func (p Permissions) IsZero() bool {
	return len(p.Publish) == 0 && len(p.Consume) == 0 && len(p.Manage) == 0
}
