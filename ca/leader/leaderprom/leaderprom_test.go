package leaderprom_test

import (
	"testing"

	"github.com/meshca/meshca/ca/leader/leaderprom"
	"github.com/meshca/meshca/internal/metricstest"
	"github.com/prometheus/client_golang/prometheus"
)

// TestLeaderMetrics: one series per Lease, 0 until this replica leads.
func TestLeaderMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := leaderprom.New(reg)
	rotator, publisher := m.Lease("meshca-root-rotator"), m.Lease("meshca-trust-publisher")
	steps := []struct {
		do                   func()
		rotatorW, publisherW float64
	}{
		{func() {}, 0, 0},
		{func() { rotator(true) }, 1, 0},
		{func() { publisher(true) }, 1, 1},
		{func() { rotator(false) }, 0, 1},
	}
	for i, s := range steps {
		s.do()
		for lease, want := range map[string]float64{"meshca-root-rotator": s.rotatorW, "meshca-trust-publisher": s.publisherW} {
			got, ok := metricstest.Sample(t, reg, "meshca_leader", map[string]string{"lease": lease})
			if !ok || got != want {
				t.Errorf("step %d: meshca_leader{lease=%q} = %v (exported: %v), want %v", i, lease, got, ok, want)
			}
		}
	}
}
