package vaultauthprom_test

import (
	"math"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/metricstest"
	"github.com/meshca/meshca/vaultauth"
	"github.com/meshca/meshca/vaultauth/vaultauthprom"
	"github.com/prometheus/client_golang/prometheus"
)

var _ vaultauth.Observer = (*vaultauthprom.Metrics)(nil)

// TestVaultMetrics: the gauges follow the Vault session's observer.
func TestVaultMetrics(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name         string
		event        func(m *vaultauthprom.Metrics)
		loggedIn     float64
		ttl          float64
		ttlIsForever bool
	}{
		{name: "before the first login", event: func(*vaultauthprom.Metrics) {}},
		{name: "logged in", event: func(m *vaultauthprom.Metrics) { m.LoggedIn(now.Add(time.Hour)) }, loggedIn: 1, ttl: 3600},
		{name: "token expired", event: func(m *vaultauthprom.Metrics) { m.LoggedIn(now.Add(-time.Minute)) }, loggedIn: 1},
		{name: "token never expires", event: func(m *vaultauthprom.Metrics) { m.LoggedIn(time.Time{}) }, loggedIn: 1, ttlIsForever: true},
		{name: "logged out", event: func(m *vaultauthprom.Metrics) { m.LoggedIn(now.Add(time.Hour)); m.LoggedOut() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			m := vaultauthprom.New(reg, func() time.Time { return now })
			tt.event(m)
			if got := gauge(t, reg, "meshca_vault_logged_in"); got != tt.loggedIn {
				t.Errorf("meshca_vault_logged_in = %v, want %v", got, tt.loggedIn)
			}
			got := gauge(t, reg, "meshca_vault_token_ttl_seconds")
			if tt.ttlIsForever && !math.IsInf(got, 1) || !tt.ttlIsForever && got != tt.ttl {
				t.Errorf("meshca_vault_token_ttl_seconds = %v, want %v (forever: %v)", got, tt.ttl, tt.ttlIsForever)
			}
		})
	}
}

// gauge returns the value of the gauge name in g, 0 when it is missing.
func gauge(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	v, ok := metricstest.Sample(t, g, name, nil)
	if !ok {
		t.Errorf("%s is not exported", name)
	}
	return v
}
