package tunnel

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
)

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
// token.
func NewStaticTokens(tokens []string, tenants map[string]string) *StaticTokens {
	a := &StaticTokens{}
	for _, t := range tokens {
		a.hashes = append(a.hashes, tokenEntry{hash: sha256.Sum256([]byte(t))})
	}
	for name, t := range tenants {
		a.hashes = append(a.hashes, tokenEntry{hash: sha256.Sum256([]byte(t)), tenant: name})
	}
	return a
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
