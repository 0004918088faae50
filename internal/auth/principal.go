package auth

import "strconv"

// Kind says how a Principal was authenticated.
type Kind uint8

// The kinds of principal. The zero Kind is anonymous; a zero Principal is
// anonymous without All, so it may do nothing.
const (
	// KindAnonymous is a peer that presented no credential on a broker
	// that accepts that (loopback only with no auth configured, or
	// auth.allow_anonymous).
	KindAnonymous Kind = iota
	// KindUser is a named user from the Users store.
	KindUser
	// KindToken is a static token from auth.tokens.
	KindToken
	// KindCertificate is a client certificate's subject (mTLS).
	KindCertificate
)

// String names the kind in logs and admin output.
func (k Kind) String() string {
	switch k {
	case KindAnonymous:
		return "anonymous"
	case KindUser:
		return "user"
	case KindToken:
		return "token"
	case KindCertificate:
		return "certificate"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Principal is the identity a connection authenticated as, and what it may
// do.
type Principal struct {
	// Name is the user name, the token label ("token#2"), the certificate
	// subject, or "" for anonymous.
	Name string
	// Kind says which of those Name is.
	Kind Kind
	// All grants every permission: anonymous peers where anonymous access
	// is allowed, and static tokens.
	All bool
	// Perms are a user's permissions; ignored when All is set.
	Perms Permissions
}

// Anonymous is the principal of a peer without credentials where the
// startup rule admits one: it may do everything, as before users existed.
func Anonymous() Principal { return Principal{Kind: KindAnonymous, All: true} }

// TokenPrincipal is the principal of the static token at index i (0-based)
// of auth.tokens. Its name is the token's 1-based position, never the token.
func TokenPrincipal(i int) Principal {
	return Principal{Name: "token#" + strconv.Itoa(i+1), Kind: KindToken, All: true}
}

// Allows reports whether p may perform a on topic.
func (p Principal) Allows(a Action, topic string) bool {
	return p.All || p.Perms.Allows(a, topic)
}

// Owner is the identity a session records as its owner and compares on
// resume. A client certificate names a user of the store (Users.Certificate),
// so a user is one owner however it logged in, "user:NAME"; a token is
// "token:token#N" and anonymous "anonymous:", so neither can pass for a
// user.
func (p Principal) Owner() string {
	if p.Kind == KindCertificate {
		return KindUser.String() + ":" + p.Name
	}
	return p.Kind.String() + ":" + p.Name
}
