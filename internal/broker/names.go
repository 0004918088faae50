package broker

import (
	"crypto/sha256"
	"encoding/hex"
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

// fileNameBytesMax is the longest file name the broker creates: the limit
// of ext4, XFS, btrfs, APFS and NTFS (in bytes, or UTF-16 units, which
// ASCII names never exceed).
const fileNameBytesMax = 255

// hashedPrefixBytes is how much of the escaped name a hashed directory name
// keeps, for operators reading the data dir: "#" + prefix + "~" + 64 hex
// digits stays within fileNameBytesMax.
const hashedPrefixBytes = fileNameBytesMax - 2 - 2*sha256.Size

// dirName maps a validated topic or group name to its directory name. Every
// valid name has one: names whose escaped form (escapeName) fits in
// fileNameBytesMax use it; longer ones (a 255-byte name with many bytes
// outside [A-Za-z0-9_.-] escapes to up to 766 bytes) use "#", a readable
// prefix of the escaped form, "~" and the SHA-256 of the name in hex. The
// two forms start differently, so they never collide, and distinct names
// never share a directory unless SHA-256 collides. The queue's meta file
// holds the real names; recovery checks them against the directory.
//
//	"orders"            -> "=orders"
//	"ü" x 127 (254 B)   -> "#%C3%BC...%C3%BC~<64 hex digits>"
func dirName(s string) string {
	e := escapeName(s)
	if len(e) <= fileNameBytesMax {
		return e
	}
	cut := hashedPrefixBytes + 1 // e[0] is '='
	// Do not split a %XX escape.
	if i := strings.LastIndexByte(e[cut-2:cut], '%'); i >= 0 {
		cut = cut - 2 + i
	}
	sum := sha256.Sum256([]byte(s))
	return "#" + e[1:cut] + "~" + hex.EncodeToString(sum[:])
}

// escapeName turns a validated topic or group name into a file name that is
// safe on any file system and cannot be "." or "..": "=" followed by the
// name with every byte outside [A-Za-z0-9_.-] written as %XX. The mapping
// is injective (a literal '%' is escaped too), so distinct names never
// share a directory. It may exceed fileNameBytesMax; dirName is what the
// broker uses.
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
