package vaultauth

import (
	"time"

	"github.com/hashicorp/vault/api"
)

// Observer hears of the login's state, for metrics. It is called with the
// session's lock held, in the order the state changed: it must be quick
// and must not call the Session (nor whatever uses it).
type Observer interface {
	// LoggedIn: a login or a renewal succeeded; its token lives until
	// expires (zero: it never expires).
	LoggedIn(expires time.Time)
	// LoggedOut: the session holds no token (a login failed, or the token
	// was given up to be replaced).
	LoggedOut()
}

// observeLoginLocked tells the observer of the token secret, fresh from a
// login or a renewal. s.mu must be held.
func (s *Session) observeLoginLocked(secret *api.Secret) {
	if s.c.Observer == nil || secret == nil || secret.Auth == nil {
		return
	}
	var expires time.Time
	if d := secret.Auth.LeaseDuration; d > 0 {
		expires = s.c.Now().Add(time.Duration(d) * time.Second)
	}
	s.c.Observer.LoggedIn(expires)
}

// observeLogoutLocked tells the observer the session holds no token. s.mu
// must be held.
func (s *Session) observeLogoutLocked() {
	if s.c.Observer != nil {
		s.c.Observer.LoggedOut()
	}
}

// renewed records that Vault renewed the token of login: renewal carries
// its new lease. A renewal of a login already replaced is ignored.
func (s *Session) renewed(login *api.Secret, renewal *api.RenewOutput) {
	if renewal == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.login == login {
		s.observeLoginLocked(renewal.Secret)
	}
}
