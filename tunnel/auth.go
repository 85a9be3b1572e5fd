package tunnel

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"
)

// MinTokenLength is the fewest characters a token may have: NewStaticTokens refuses shorter
// connector and tenant tokens, and NewServer a shorter AdminToken. Failed authentications are
// throttled per source address (ServerConfig.PreAuth.MaxAuthFailuresPerIP), which makes guessing a
// random token of this length hopeless; a short one could still be found.
const MinTokenLength = 16

// ValidateToken reports why token cannot authenticate anyone ("tunnel: token is 7
// characters long; a token needs at least 16"), or returns nil. Its only rule is
// MinTokenLength. The error never holds the token.
func ValidateToken(token string) error {
	if p := TokenProblem(token); p != "" {
		return errors.New("tunnel: token " + p)
	}
	return nil
}

// TokenProblem is ValidateToken's rule as words that follow the token's name ("is 7
// characters long; a token needs at least 16"), for a message that names the token in its
// own way; "" when token is long enough. The words never hold the token.
func TokenProblem(token string) string {
	if n := utf8.RuneCountInString(token); n < MinTokenLength {
		return fmt.Sprintf("is %d characters long; a token needs at least %d", n, MinTokenLength)
	}
	return ""
}

// checkTokenLength refuses a token shorter than MinTokenLength; what names it in the error
// (the token itself never appears).
func checkTokenLength(what, token string) error {
	if p := TokenProblem(token); p != "" {
		return errors.New("tunnel: " + what + " " + p)
	}
	return nil
}

// Authenticator decides whether a connector's token may connect, and as which tenant.
// A tenant is an identity that owns tunnels; the admin API scopes what a tenant token sees
// to that tenant's groups. Implementations must be safe for concurrent use.
type Authenticator interface {
	// Authenticate returns the tenant name for a valid token ("" for a token that belongs
	// to no tenant) or an error wrapping ErrUnauthorized.
	Authenticate(ctx context.Context, token string) (tenant string, err error)
}

// AuthenticatorFunc adapts a function to Authenticator.
type AuthenticatorFunc func(ctx context.Context, token string) (string, error)

// Authenticate implements Authenticator.
func (f AuthenticatorFunc) Authenticate(ctx context.Context, token string) (string, error) {
	return f(ctx, token)
}

// StaticTokens is an Authenticator over a fixed set of tokens. Tokens are kept and compared
// as SHA-256 hashes, in constant time.
type StaticTokens struct {
	hashes []tokenEntry
}

type tokenEntry struct {
	hash   [32]byte
	tenant string
}

// NewStaticTokens accepts the plain tokens (no tenant) and, per tenant name, that tenant's
// token. It returns an error, naming the token by its position or tenant and never by its
// value, when a token is shorter than MinTokenLength characters.
func NewStaticTokens(tokens []string, tenants map[string]string) (*StaticTokens, error) {
	a := &StaticTokens{}
	for i, t := range tokens {
		if err := checkTokenLength(fmt.Sprintf("token %d", i), t); err != nil {
			return nil, err
		}
		a.hashes = append(a.hashes, tokenEntry{hash: sha256.Sum256([]byte(t))})
	}
	for _, name := range slices.Sorted(maps.Keys(tenants)) {
		t := tenants[name]
		if err := checkTokenLength(fmt.Sprintf("the token of tenant %q", name), t); err != nil {
			return nil, err
		}
		a.hashes = append(a.hashes, tokenEntry{hash: sha256.Sum256([]byte(t)), tenant: name})
	}
	return a, nil
}

// Authenticate implements Authenticator. Every entry is compared, so the time taken does not
// depend on which token matched.
func (a *StaticTokens) Authenticate(_ context.Context, token string) (string, error) {
	h := sha256.Sum256([]byte(token))
	found, tenant := 0, ""
	for _, e := range a.hashes {
		if subtle.ConstantTimeCompare(h[:], e.hash[:]) == 1 {
			found, tenant = 1, e.tenant
		}
	}
	if found == 0 {
		return "", ErrUnauthorized
	}
	return tenant, nil
}
