package auth

// This file is owned by the permissions work; what is here is the minimal
// shared contract (the types and the matching rule) that the identity code
// builds on until the full model replaces it.

import (
	"fmt"
	"strings"
)

// Action is what a request does to a topic, for permission checks.
type Action uint8

// The actions a permission can grant.
const (
	// ActionPublish covers PUBLISH.
	ActionPublish Action = iota + 1
	// ActionConsume covers SUBSCRIBE and reads; settles are covered by the
	// lease they hold.
	ActionConsume
	// ActionManage covers DECLARE, PURGE, DELETE and dead-letter
	// replay/move/discard.
	ActionManage
)

// Permissions lists, per action, topic patterns: "orders" matches exactly
// that topic; a pattern ending in "*" matches every topic with that prefix
// ("orders.*", "*" = all).
type Permissions struct {
	Publish []string `json:"publish"`
	Consume []string `json:"consume"`
	Manage  []string `json:"manage"`
}

// Allows reports whether p grants a on topic.
func (p Permissions) Allows(a Action, topic string) bool {
	var pats []string
	switch a {
	case ActionPublish:
		pats = p.Publish
	case ActionConsume:
		pats = p.Consume
	case ActionManage:
		pats = p.Manage
	}
	for _, pat := range pats {
		if prefix, ok := strings.CutSuffix(pat, "*"); ok {
			if strings.HasPrefix(topic, prefix) {
				return true
			}
		} else if pat == topic {
			return true
		}
	}
	return false
}

// Validate returns an error naming the first bad pattern: an empty one, or
// one with "*" anywhere but at the end.
func (p Permissions) Validate() error {
	for _, list := range [][]string{p.Publish, p.Consume, p.Manage} {
		for _, pat := range list {
			if pat == "" {
				return fmt.Errorf("auth: empty topic pattern")
			}
			if i := strings.IndexByte(pat, '*'); i >= 0 && i != len(pat)-1 {
				return fmt.Errorf("auth: topic pattern %q: '*' only at the end", pat)
			}
		}
	}
	return nil
}
