package leaderprom_test

import (
	"testing"

	"github.com/meshca/meshca/ca/leader/leaderprom"
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
			got, ok := gauge(t, reg, "meshca_leader", map[string]string{"lease": lease})
			if !ok || got != want {
				t.Errorf("step %d: meshca_leader{lease=%q} = %v (exported: %v), want %v", i, lease, got, ok, want)
			}
		}
	}
}

// gauge returns the value of the gauge name{labels} in g, and whether it
// exists.
func gauge(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metrics
				}
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}
