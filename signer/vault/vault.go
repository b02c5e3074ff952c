// Package vault signs workload certificates with HashiCorp Vault's PKI
// secrets engine (<mount>/sign/<role>), logged in with a token file,
// AppRole or the Kubernetes auth method, and keeps that login alive.
//
// The trust bundle is never learned from Vault: Vault answers with its
// issuing CA, often an intermediate. The chain Vault returns only shapes
// the reply; meshca verifies it against its pinned anchors.
package vault

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/signer"
)

const name = "vault"

// Config of the Vault backend.
type Config struct {
	// Address of Vault, e.g. https://vault.vault.svc:8200.
	Address string
	// CACertFile verifies Vault's own TLS certificate.
	CACertFile string
	// Mount of the PKI engine ("pki") and the role to sign with.
	Mount, Role string
	// Auth logs in. Its token is renewed while it can be, and a fresh
	// login replaces it when it can no longer be renewed or is refused.
	Auth api.AuthMethod
	// Timeout bounds every call that has no earlier deadline.
	Timeout time.Duration
	// OnLoginError reports failed logins, renewals and revocations of
	// replaced tokens (logged by the caller); nil ignores them. The errors
	// never carry a token.
	OnLoginError func(error)
	// ReloginBackoff is the least time between two logins forced by Vault
	// refusing to sign (403). Within it, a 403 fails as signer.KindRefused
	// without a login. Zero means DefaultReloginBackoff.
	ReloginBackoff time.Duration
	// Now is the clock that ReloginBackoff is measured on; nil means
	// time.Now.
	Now func() time.Time
}

// DefaultReloginBackoff is Config.ReloginBackoff when it is not set.
const DefaultReloginBackoff = 30 * time.Second

// Signer is the Vault backend. Run keeps its login alive.
type Signer struct {
	c      Config
	client *api.Client
	mu     sync.Mutex
	login  *api.Secret
	// inflight is the login under way, shared by every request waiting
	// for it; nil when none is.
	inflight *loginCall
	// relogin asks Run for a fresh login now.
	relogin chan struct{}
	// deniedAt is when the last login forced by a 403 started; zero
	// before the first.
	deniedAt time.Time
}

type loginCall struct {
	done chan struct{}
	err  error
	// replaces is the login a 403 condemned, revoked once this one
	// succeeds; nil for other logins.
	replaces *api.Secret
}

var _ signer.Signer = (*Signer)(nil)

// New returns a Vault signer; it does no I/O. Run logs in.
func New(c Config) (*Signer, error) {
	switch {
	case c.Address == "":
		return nil, errors.New("vault: address is required")
	case c.Role == "":
		return nil, errors.New("vault: role is required")
	case c.Auth == nil:
		return nil, errors.New("vault: a login method is required")
	}
	if c.Mount == "" {
		c.Mount = "pki"
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.ReloginBackoff <= 0 {
		c.ReloginBackoff = DefaultReloginBackoff
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	cfg := api.DefaultConfig()
	cfg.Address = c.Address
	cfg.Timeout = c.Timeout
	cfg.MaxRetries = 0 // meshca's clients retry; a hidden retry would blow their deadline
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
	return &Signer{c: c, client: client, relogin: make(chan struct{}, 1)}, nil
}

// Sign implements signer.Signer with <mount>/sign/<role>. When Vault
// refuses the token (403), Sign logs in again and retries once, but forces
// at most one such login per Config.ReloginBackoff (see reloginDenied).
func (s *Signer) Sign(ctx context.Context, req *signer.Request) (*signer.Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: err}
	}
	used, err := s.session(ctx)
	if err != nil {
		return nil, err
	}
	data := map[string]any{
		"csr":                  string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req.CSR.Raw})),
		"uri_sans":             req.ID.String(),
		"ttl":                  fmt.Sprintf("%ds", int64(req.TTL/time.Second)),
		"format":               "pem",
		"exclude_cn_from_sans": true,
	}
	path := s.c.Mount + "/sign/" + s.c.Role
	secret, err := s.client.Logical().WriteWithContext(ctx, path, data)
	if isPermissionDenied(err) {
		// The token expired or was revoked, or the role's policy refuses:
		// log in again (at most once per ReloginBackoff), then retry once.
		if lerr := s.reloginDenied(ctx, used, err); lerr != nil {
			return nil, lerr
		}
		secret, err = s.client.Logical().WriteWithContext(ctx, path, data)
	}
	if err != nil {
		return nil, classify(err)
	}
	return s.response(req, secret)
}

// response assembles and checks what Vault issued.
func (s *Signer) response(req *signer.Request, secret *api.Secret) (*signer.Response, error) {
	if secret == nil || secret.Data == nil {
		return nil, signer.Errorf(name, signer.KindInternal, "empty answer from %s/sign/%s", s.c.Mount, s.c.Role)
	}
	certPEM, _ := secret.Data["certificate"].(string)
	certs, err := pemutil.ParseCertificates([]byte(certPEM))
	if err != nil || len(certs) == 0 {
		return nil, signer.Errorf(name, signer.KindInternal, "answer holds no certificate: %v", err)
	}
	leaf := certs[0]
	var chain []string
	if list, ok := secret.Data["ca_chain"].([]any); ok {
		for _, v := range list {
			if p, ok := v.(string); ok {
				chain = append(chain, p)
			}
		}
	}
	if len(chain) == 0 {
		if p, ok := secret.Data["issuing_ca"].(string); ok {
			chain = []string{p}
		}
	}
	intermediates := certs[1:]
	limit := time.Time{}
	for _, p := range chain {
		cs, err := pemutil.ParseCertificates([]byte(p))
		if err != nil {
			return nil, signer.Errorf(name, signer.KindInternal, "answer's CA chain: %w", err)
		}
		for _, c := range cs {
			if limit.IsZero() || c.NotAfter.Before(limit) {
				limit = c.NotAfter
			}
			if string(c.RawIssuer) == string(c.RawSubject) && c.CheckSignatureFrom(c) == nil {
				continue // a root travels only in meshca's own bundle
			}
			intermediates = append(intermediates, c)
		}
	}
	if err := signer.CheckIssued(name, req, leaf, limit); err != nil {
		return nil, err
	}
	return &signer.Response{Leaf: leaf, Intermediates: intermediates}, nil
}

func (s *Signer) loggedIn() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.login != nil
}

// session returns the current login, logging in first if there is none.
// The result may be nil if Run forgot the new login meanwhile.
func (s *Signer) session(ctx context.Context) (*api.Secret, error) {
	s.mu.Lock()
	cur := s.login
	s.mu.Unlock()
	if cur != nil {
		return cur, nil
	}
	if err := s.doLogin(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.login, nil
}

// doLogin logs in now. Concurrent callers share one login, and each stops
// waiting when its own context ends.
func (s *Signer) doLogin(ctx context.Context) error {
	s.mu.Lock()
	call := s.startLoginLocked(nil)
	s.mu.Unlock()
	return waitLogin(ctx, call)
}

// startLoginLocked returns the login under way, starting one that replaces
// the given login if none is. s.mu must be held.
func (s *Signer) startLoginLocked(replaces *api.Secret) *loginCall {
	if s.inflight == nil {
		s.inflight = &loginCall{done: make(chan struct{}), replaces: replaces}
		go s.runLogin(s.inflight)
	}
	return s.inflight
}

// waitLogin waits for call or the end of ctx, whichever comes first.
func waitLogin(ctx context.Context, call *loginCall) error {
	select {
	case <-ctx.Done():
		return &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: fmt.Errorf("waiting for the Vault login: %w", ctx.Err())}
	case <-call.done:
		return call.err
	}
}

func (s *Signer) runLogin(call *loginCall) {
	ctx, cancel := context.WithTimeout(context.Background(), s.c.Timeout)
	defer cancel()
	secret, err := s.c.Auth.Login(ctx, s.client)
	switch {
	case err != nil:
		call.err = classifyLogin(err)
	case secret == nil || secret.Auth == nil || secret.Auth.ClientToken == "":
		call.err = signer.Errorf(name, signer.KindRefused, "login returned no token")
	}
	s.mu.Lock()
	if call.err == nil {
		s.client.SetToken(secret.Auth.ClientToken)
		s.login = secret
	} else {
		s.login = nil
	}
	s.inflight = nil
	s.mu.Unlock()
	close(call.done)
	if call.err == nil {
		select {
		case s.relogin <- struct{}{}: // let Run watch the new token
		default:
		}
		s.revoke(call.replaces, secret)
	}
}

// Run keeps the login alive until ctx ends: it renews the token while
// Vault allows and logs in afresh when it no longer does.
func (s *Signer) Run(ctx context.Context) error {
	backoff := time.Second
	for ctx.Err() == nil {
		if !s.loggedIn() {
			if err := s.doLogin(ctx); err != nil {
				s.report(err)
				if !sleep(ctx, backoff) {
					return nil
				}
				backoff = min(2*backoff, time.Minute)
				continue
			}
		}
		backoff = time.Second
		s.mu.Lock()
		secret := s.login
		s.mu.Unlock()
		select {
		case <-s.relogin:
		default:
		}
		if !secret.Auth.Renewable || secret.Auth.LeaseDuration <= 0 {
			// Not renewable: log in again when two thirds have passed, or
			// on demand.
			wait := time.Duration(secret.Auth.LeaseDuration) * time.Second * 2 / 3
			if wait <= 0 {
				wait = time.Hour
			}
			select {
			case <-ctx.Done():
				return nil
			case <-s.relogin:
			case <-time.After(wait):
				s.forget(secret)
			}
			continue
		}
		w, err := s.client.NewLifetimeWatcher(&api.LifetimeWatcherInput{Secret: secret})
		if err != nil {
			s.report(err)
			s.forget(secret)
			continue
		}
		go w.Start()
		select {
		case <-ctx.Done():
			w.Stop()
			return nil
		case <-s.relogin:
			w.Stop()
		case err := <-w.DoneCh():
			s.report(err)
			w.Stop()
			s.forget(secret)
		}
	}
	return nil
}

// report passes a login failure to Config.OnLoginError.
func (s *Signer) report(err error) {
	if s.c.OnLoginError != nil && err != nil {
		s.c.OnLoginError(err)
	}
}

// forget drops the login if it is still secret, so the next use logs in.
func (s *Signer) forget(secret *api.Secret) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.login == secret {
		s.login = nil
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func isPermissionDenied(err error) bool {
	var re *api.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusForbidden
}

// classify maps a Vault failure to whether a retry can help.
func classify(err error) error {
	var (
		re  *api.ResponseError
		ue  *url.Error
		ne  net.Error
		out = &signer.Error{Backend: name, Kind: signer.KindRefused, Err: err}
	)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		out.Kind = signer.KindUnavailable
	case errors.As(err, &re):
		// 5xx: down, sealed (503), standby; 429: rate limited.
		if re.StatusCode >= 500 || re.StatusCode == http.StatusTooManyRequests {
			out.Kind = signer.KindUnavailable
		}
	case errors.As(err, &ue), errors.As(err, &ne):
		out.Kind = signer.KindUnavailable
	}
	return out
}

func classifyLogin(err error) error {
	e := classify(err).(*signer.Error)
	e.Err = fmt.Errorf("login: %w", err)
	return e
}
