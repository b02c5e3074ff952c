// Package vaultauth is meshca's login to HashiCorp Vault, shared by every
// part that talks to Vault (the per-leaf signer in signer/vault, the
// Vault upstreams in keymgr/upstream): a client without hidden retries, a
// Session that logs in with a token file, AppRole or the Kubernetes auth
// method, shares one login among concurrent callers, renews the token
// while Vault allows, logs in afresh when it no longer does or when a 403
// condemns it (at most once per Config.ReloginBackoff), revokes a token
// it replaced, and tells an Observer; and the classification of Vault's
// failures into unavailable (retry) or refused (an operator must act).
//
// Errors never carry a token.
package vaultauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/vault/api"
)

// Config of a Vault login.
type Config struct {
	// Address of Vault, e.g. https://vault.vault.svc:8200.
	Address string
	// CACertFile verifies Vault's own TLS certificate.
	CACertFile string
	// Auth logs in. Its token is renewed while it can be, and a fresh
	// login replaces it when it can no longer be renewed or is refused.
	Auth api.AuthMethod
	// Timeout bounds every call that has no earlier deadline; zero means
	// DefaultTimeout.
	Timeout time.Duration
	// OnLoginError reports failed logins, renewals and revocations of
	// replaced tokens (logged by the caller); nil ignores them.
	OnLoginError func(error)
	// ReloginBackoff is the least time between two logins forced by Vault
	// refusing a request (403). Within it, a 403 fails as KindRefused
	// without a login. Zero means DefaultReloginBackoff.
	ReloginBackoff time.Duration
	// Now is the clock ReloginBackoff and the token's expiry are measured
	// on; nil means time.Now.
	Now func() time.Time
	// Observer hears whether the session holds a token and when it
	// expires; nil ignores it.
	Observer Observer
}

// DefaultTimeout is Config.Timeout when it is not set.
const DefaultTimeout = 10 * time.Second

// DefaultReloginBackoff is Config.ReloginBackoff when it is not set.
const DefaultReloginBackoff = 30 * time.Second

// maxIdleConns is the least number of idle connections to Vault kept.
const maxIdleConns = 100

// withDefaults fills c's zero fields.
func (c Config) withDefaults() Config {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.ReloginBackoff <= 0 {
		c.ReloginBackoff = DefaultReloginBackoff
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// NewClient is a Vault client for c, without a token and without hidden
// retries.
func NewClient(c Config) (*api.Client, error) {
	if c.Address == "" {
		return nil, errors.New("vault: address is required")
	}
	cfg := api.DefaultConfig()
	cfg.Address = c.Address
	cfg.Timeout = c.withDefaults().Timeout
	cfg.MaxRetries = 0 // meshca's clients retry; a hidden retry would blow their deadline
	// Keep a connection for every request in flight: the default pool keeps
	// GOMAXPROCS+1 idle, so over HTTP/1.1 (a Vault without TLS, or one
	// that does not speak HTTP/2) a busy CA closed and reopened one per
	// request or so: a TCP (and TLS) handshake on both sides each time.
	if t, ok := cfg.HttpClient.Transport.(*http.Transport); ok {
		t.MaxIdleConnsPerHost = max(t.MaxIdleConns, maxIdleConns)
	}
	if c.CACertFile != "" {
		if err := cfg.ConfigureTLS(&api.TLSConfig{CACert: c.CACertFile}); err != nil {
			return nil, fmt.Errorf("vault: CA file: %w", err)
		}
	}
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	client.ClearToken()
	return client, nil
}

// Login logs in once with c.Auth and returns a client holding the token,
// for a command that runs a few calls and exits (`meshca root`); a server
// keeps a Session instead.
func Login(ctx context.Context, c Config) (*api.Client, error) {
	if c.Auth == nil {
		return nil, errors.New("vault: a login method is required")
	}
	client, err := NewClient(c)
	if err != nil {
		return nil, err
	}
	secret, err := c.Auth.Login(ctx, client)
	switch {
	case err != nil:
		return nil, classifyLogin(err)
	case secret == nil || secret.Auth == nil || secret.Auth.ClientToken == "":
		return nil, &Error{Kind: KindRefused, Err: errors.New("login returned no token")}
	}
	client.SetToken(secret.Auth.ClientToken)
	return client, nil
}
