package vaultauth

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/vault/api"
)

// Session is a login to Vault kept alive: it logs in, shares one login
// among concurrent callers, renews the token while Vault allows, logs in
// afresh when it no longer does or when a 403 condemns it (at most once
// per Config.ReloginBackoff), revokes a token it replaced, and tells the
// Observer. Callers use its Client, which carries the current token.
type Session struct {
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

// NewSession returns a session over a client of its own; it does no I/O.
// Run keeps the login alive; a call before Run, or while Run has no
// token, logs in first.
func NewSession(c Config) (*Session, error) {
	if c.Auth == nil {
		return nil, errors.New("vault: a login method is required")
	}
	c = c.withDefaults()
	client, err := NewClient(c)
	if err != nil {
		return nil, err
	}
	return &Session{c: c, client: client, relogin: make(chan struct{}, 1)}, nil
}

// Client is the session's Vault client. It sends the current token;
// calls through Write, Read and List log in first when there is none.
func (s *Session) Client() *api.Client { return s.client }

// loginCall is one login under way, shared by every request waiting for
// it.
type loginCall struct {
	done chan struct{}
	err  error
	// replaces is the login a 403 condemned, revoked once this one
	// succeeds; nil for other logins.
	replaces *api.Secret
}

func (s *Session) loggedIn() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.login != nil
}

// Current returns the current login, logging in first if there is none.
// The result may be nil if Run forgot the new login meanwhile. Pass it to
// ReloginDenied when Vault refuses a call made with it.
func (s *Session) Current(ctx context.Context) (*api.Secret, error) {
	// Looking for the login and joining (or starting) one happen under
	// one lock: a caller that found none while a login was finishing
	// would otherwise start a second one.
	s.mu.Lock()
	if cur := s.login; cur != nil {
		s.mu.Unlock()
		return cur, nil
	}
	call := s.startLoginLocked(nil)
	s.mu.Unlock()
	if err := waitLogin(ctx, call); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.login, nil
}

// doLogin logs in now. Concurrent callers share one login, and each stops
// waiting when its own context ends.
func (s *Session) doLogin(ctx context.Context) error {
	s.mu.Lock()
	call := s.startLoginLocked(nil)
	s.mu.Unlock()
	return waitLogin(ctx, call)
}

// startLoginLocked returns the login under way, starting one that replaces
// the given login if none is. s.mu must be held.
func (s *Session) startLoginLocked(replaces *api.Secret) *loginCall {
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
		return &Error{Kind: KindUnavailable, Err: fmt.Errorf("waiting for the Vault login: %w", ctx.Err())}
	case <-call.done:
		return call.err
	}
}

func (s *Session) runLogin(call *loginCall) {
	ctx, cancel := context.WithTimeout(context.Background(), s.c.Timeout)
	defer cancel()
	secret, err := s.c.Auth.Login(ctx, s.client)
	switch {
	case err != nil:
		call.err = classifyLogin(err)
	case secret == nil || secret.Auth == nil || secret.Auth.ClientToken == "":
		call.err = &Error{Kind: KindRefused, Err: errors.New("login returned no token")}
	}
	s.mu.Lock()
	if call.err == nil {
		s.client.SetToken(secret.Auth.ClientToken)
		s.login = secret
		s.observeLoginLocked(secret)
	} else {
		s.login = nil
		s.observeLogoutLocked()
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
func (s *Session) Run(ctx context.Context) error {
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
		w, err := s.newWatcher(secret)
		if err != nil {
			s.report(err)
			s.forget(secret)
			continue
		}
		go w.Start()
		if !s.watch(ctx, w, secret) {
			return nil
		}
	}
	return nil
}

// renewEvery is the least time between two renewals of a token. Vault's
// LifetimeWatcher (vault/api v1.22) retries a failing renewal without a
// pause once its back-off would outlast the lease, until the lease is
// nearly over (hashicorp/vault#28611): thousands of calls a second to a
// Vault that is failing.
const renewEvery = time.Second

// newWatcher returns a LifetimeWatcher renewing secret's token through a
// client of its own, which sends a renewal every renewEvery at most.
func (s *Session) newWatcher(secret *api.Secret) (*api.LifetimeWatcher, error) {
	c, err := s.client.Clone()
	if err != nil {
		return nil, err
	}
	c.SetLimiter(float64(time.Second/renewEvery), 1)
	return c.NewLifetimeWatcher(&api.LifetimeWatcherInput{Secret: secret})
}

// watch follows the renewals of login's token until the watcher gives
// up (a fresh login replaces it, or it is forgotten when its renewal
// failed), a new login is asked for, or ctx ends (false).
func (s *Session) watch(ctx context.Context, w *api.LifetimeWatcher, login *api.Secret) bool {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-s.relogin:
			return true
		case r := <-w.RenewCh():
			s.renewed(login, r)
		case err := <-w.DoneCh():
			if err != nil {
				s.report(err)
				s.forget(login)
				return true
			}
			// Vault renews the token no further (its max TTL is near),
			// but it still works for the watcher's grace: log in before
			// giving it up, so that requests are signed meanwhile. A
			// failed login drops it (runLogin) and Run tries again.
			if err := s.doLogin(ctx); err != nil && ctx.Err() == nil {
				s.report(err)
			}
			return true
		}
	}
}

// report passes a login failure to Config.OnLoginError.
func (s *Session) report(err error) {
	if s.c.OnLoginError != nil && err != nil {
		s.c.OnLoginError(err)
	}
}

// forget drops the login if it is still secret, so the next use logs in.
func (s *Session) forget(secret *api.Secret) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.login == secret {
		s.login = nil
		s.observeLogoutLocked()
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
