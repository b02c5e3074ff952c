// Package vaultauthprom exports meshca's Vault login as Prometheus
// metrics: it implements vaultauth.Observer, which cmd/meshca wires to
// the session of the Vault signer or of a Vault upstream.
package vaultauthprom

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics show meshca's Vault login (the per-leaf signer's or a Vault
// upstream's): whether meshca holds a token
// (meshca_vault_logged_in) and how long that token has left
// (meshca_vault_token_ttl_seconds). It implements vaultauth.Observer.
type Metrics struct {
	now      func() time.Time
	mu       sync.Mutex
	loggedIn bool
	expires  time.Time // zero: the token never expires
}

// New registers the gauges with reg; now (time.Now when nil)
// is the clock the token's remaining lifetime is measured on. Until the
// first login they say logged out.
func New(reg prometheus.Registerer, now func() time.Time) *Metrics {
	if now == nil {
		now = time.Now
	}
	m := &Metrics{now: now}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshca_vault_logged_in", Help: "1 while meshca holds a Vault token from a successful login or renewal, else 0.",
		}, m.loggedInValue),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshca_vault_token_ttl_seconds",
			Help: "Seconds the Vault token has left as of its last login or renewal (0 when logged out, +Inf for a token that never expires).",
		}, m.ttl),
	)
	return m
}

// LoggedIn records a login or a renewal whose token lives until expires
// (zero: never expires).
func (m *Metrics) LoggedIn(expires time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loggedIn, m.expires = true, expires
}

// LoggedOut records that meshca holds no usable token.
func (m *Metrics) LoggedOut() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loggedIn, m.expires = false, time.Time{}
}

func (m *Metrics) loggedInValue() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.loggedIn {
		return 1
	}
	return 0
}

func (m *Metrics) ttl() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case !m.loggedIn:
		return 0
	case m.expires.IsZero():
		return math.Inf(1)
	}
	return max(m.expires.Sub(m.now()).Seconds(), 0)
}
