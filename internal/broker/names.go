package broker

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sinewmq/sinew/protocol"
)

// validName checks a topic (empty not allowed) or group (empty allowed)
// name: at most NameBytesMax bytes of printable UTF-8 without '/'.
func validName(what, s string, emptyOK bool) error {
	switch {
	case s == "" && !emptyOK:
		return protocol.Errorf(protocol.CodeBadRequest, "%s is empty", what)
	case len(s) > NameBytesMax:
		return protocol.Errorf(protocol.CodeBadRequest, "%s is %d bytes, more than %d", what, len(s), NameBytesMax)
	case !utf8.ValidString(s):
		return protocol.Errorf(protocol.CodeBadRequest, "%s is not valid UTF-8", what)
	case strings.ContainsRune(s, '/'):
		return protocol.Errorf(protocol.CodeBadRequest, "%s contains '/'", what)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return protocol.Errorf(protocol.CodeBadRequest, "%s contains the unprintable character %U", what, r)
		}
	}
	return nil
}

// escapeName turns a validated topic or group name into a file name that is
// safe on any file system and cannot be "." or "..": "=" followed by the
// name with every byte outside [A-Za-z0-9_.-] written as %XX. The mapping
// is injective (a literal '%' is escaped too), so distinct names never
// share a directory.
//
//	"orders"      -> "=orders"
//	""            -> "="
//	".."          -> "=.."
//	"a b/ü"       -> "=a%20b%2F%C3%BC"
func escapeName(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 1)
	b.WriteByte('=')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '.', c == '-':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}
