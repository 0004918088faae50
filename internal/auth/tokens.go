package auth

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// Bounds of a static token (auth.tokens). A token gives every permission
// and is checked in constant time, so its only protection is that it cannot
// be guessed: TokenBytesMin is 32 because 32 hexadecimal digits, the least
// dense common encoding of random bytes, carry 128 bits.
const (
	// TokenBytesMin is the shortest token accepted.
	TokenBytesMin = 32
	// TokenBytesMax is the longest, so a token fits an HTTP Authorization
	// header and a HELLO comfortably.
	TokenBytesMax = 1024
	// tokenRandomBytes is how many random bytes GenerateToken encodes:
	// 256 bits, as 64 hexadecimal digits.
	tokenRandomBytes = 32
)

// TokenGenerateHint is how to make a token that passes CheckToken, for
// error messages.
const TokenGenerateHint = "generate one with: sinew auth token"

// CheckToken applies the token rule: TokenBytesMin to TokenBytesMax bytes
// of printable ASCII without spaces (0x21 to 0x7e), so a token survives an
// HTTP header, an environment variable and a flag unchanged. The length is
// what can be checked; the randomness is the generator's (GenerateToken).
// The error never holds the token.
func CheckToken(t string) error {
	if len(t) < TokenBytesMin {
		return fmt.Errorf("%d characters, want at least %d (128 bits as hexadecimal digits)", len(t), TokenBytesMin)
	}
	if len(t) > TokenBytesMax {
		return fmt.Errorf("%d characters, want at most %d", len(t), TokenBytesMax)
	}
	for i := 0; i < len(t); i++ {
		if t[i] < 0x21 || t[i] > 0x7e {
			return fmt.Errorf("character %d is not printable ASCII without spaces", i+1)
		}
	}
	return nil
}

// CheckTokens applies CheckToken to every token of auth.tokens. The error
// names the first bad token by its position (1-based, as in token#N),
// never by its value, since it goes to a terminal and to logs, and says how
// to generate a good one.
func CheckTokens(tokens []string) error {
	for i, t := range tokens {
		if err := CheckToken(t); err != nil {
			return fmt.Errorf("auth.tokens: token %d of %d: %v; %s", i+1, len(tokens), err, TokenGenerateHint)
		}
	}
	return nil
}

// GenerateToken returns a new random token: 32 bytes from crypto/rand as
// 64 hexadecimal digits (256 bits), which CheckToken accepts.
func GenerateToken() string {
	b := make([]byte, tokenRandomBytes)
	rand.Read(b) // crypto/rand.Read never fails (it crashes the program instead)
	return hex.EncodeToString(b)
}
