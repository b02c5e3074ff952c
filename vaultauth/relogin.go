package vaultauth

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/vault/api"
)

// Do calls call with the session's client, logged in; when Vault refuses
// (403) it logs in again, as ReloginDenied allows, and calls once more.
// path names the call in errors. A failure is an *Error.
func (s *Session) Do(ctx context.Context, path string, call func(context.Context, *api.Logical) (*api.Secret, error)) (*api.Secret, error) {
	if err := ctx.Err(); err != nil {
		return nil, &Error{Kind: KindUnavailable, Err: err}
	}
	used, err := s.Current(ctx)
	if err != nil {
		return nil, err
	}
	secret, err := call(ctx, s.client.Logical())
	if IsPermissionDenied(err) {
		if lerr := s.ReloginDenied(ctx, used, path, err); lerr != nil {
			return nil, lerr
		}
		secret, err = call(ctx, s.client.Logical())
	}
	if err != nil {
		return nil, Classify(fmt.Errorf("%s: %w", path, err))
	}
	return secret, nil
}

// Write writes data to path through Do.
func (s *Session) Write(ctx context.Context, path string, data map[string]any) (*api.Secret, error) {
	return s.Do(ctx, path, func(ctx context.Context, l *api.Logical) (*api.Secret, error) {
		return l.WriteWithContext(ctx, path, data)
	})
}

// Read reads path through Do; a path Vault does not have reads as nil.
func (s *Session) Read(ctx context.Context, path string) (*api.Secret, error) {
	return s.Do(ctx, path, func(ctx context.Context, l *api.Logical) (*api.Secret, error) {
		return l.ReadWithContext(ctx, path)
	})
}

// ReloginDenied answers Vault refusing (403) the call to path made with
// the login used: nil when the caller should retry with a newer login,
// an *Error of KindRefused when not.
//
// A token that expired or was revoked is cured by a fresh login, but a
// role or policy that refuses meshca is not, and logging in for every
// refused request would turn each workload request into a Vault login. So
// a 403 forces at most one login per ReloginBackoff; requests refused
// meanwhile share that login while it is under way, retry with its token
// once it is in place, and fail as refused after that.
func (s *Session) ReloginDenied(ctx context.Context, used *api.Secret, path string, denied error) error {
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
		return &Error{Kind: KindRefused, Err: fmt.Errorf(
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
func (s *Session) revoke(old, fresh *api.Secret) {
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
	if err := c.Auth().Token().RevokeSelfWithContext(ctx, ""); err != nil && !IsPermissionDenied(err) {
		s.report(fmt.Errorf("vault: revoking the replaced token: %w", err))
	}
}
