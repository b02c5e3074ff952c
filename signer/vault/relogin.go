package vault

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/signer"
)

// reloginDenied answers Vault refusing (403) to sign at path with the
// login used: nil when the caller should retry with a newer login, an
// error when not.
//
// A token that expired or was revoked is cured by a fresh login, but a
// role or policy that refuses meshca is not, and logging in for every
// refused request would turn each workload request into a Vault login. So
// a 403 forces at most one login per ReloginBackoff; requests refused
// meanwhile share that login while it is under way, retry with its token
// once it is in place, and fail as refused after that.
func (s *session) reloginDenied(ctx context.Context, used *api.Secret, path string, denied error) error {
	s.mu.Lock()
	now := s.c.Now()
	var call *loginCall
	switch {
	case s.inflight != nil:
		call = s.inflight
	case s.login != nil && s.login != used:
		// Replaced since this request was sent. (The shared client may
		// already have sent the new token; then the retry costs one more
		// refusal, never a login.)
		s.mu.Unlock()
		return nil
	case !s.deniedAt.IsZero() && now.Sub(s.deniedAt) < s.c.ReloginBackoff:
		last, next := now.Sub(s.deniedAt), s.deniedAt.Add(s.c.ReloginBackoff).Sub(now)
		s.mu.Unlock()
		return &signer.Error{Backend: name, Kind: signer.KindRefused, Err: fmt.Errorf(
			"%s refused although meshca logged in again %s ago (check the role and the login's policies); next login in %s at the earliest: %w",
			path, last.Round(timeRound), next.Round(timeRound), denied)}
	default:
		s.deniedAt = now
		call = s.startLoginLocked(used)
	}
	s.mu.Unlock()
	return waitLogin(ctx, call)
}

// timeRound rounds the durations in error messages.
const timeRound = 100 * time.Millisecond

// revoke revokes old, the login that fresh replaced after a 403, with
// auth/token/revoke-self: best effort, bounded by Config.Timeout. A 403
// means old is already unusable, as expected after an expiry or a
// revocation, and is not reported. A token read from a file belongs to
// whoever wrote it and is never revoked.
func (s *session) revoke(old, fresh *api.Secret) {
	if old == nil || old.Auth == nil || old.Auth.ClientToken == "" ||
		fresh == nil || fresh.Auth == nil || old.Auth.ClientToken == fresh.Auth.ClientToken {
		return
	}
	switch s.c.Auth.(type) {
	case TokenFile, *TokenFile:
		return
	}
	// A client of its own: revoke-self revokes the token its client
	// sends, and the shared client already sends the fresh one.
	c, err := s.client.Clone()
	if err != nil {
		s.report(fmt.Errorf("vault: revoking the replaced token: %w", err))
		return
	}
	c.SetToken(old.Auth.ClientToken)
	ctx, cancel := context.WithTimeout(context.Background(), s.c.Timeout)
	defer cancel()
	if err := c.Auth().Token().RevokeSelfWithContext(ctx, ""); err != nil && !isPermissionDenied(err) {
		s.report(fmt.Errorf("vault: revoking the replaced token: %w", err))
	}
}
