// Package metricstest reads series back from a Prometheus gatherer in
// tests: the value a counter, gauge or histogram exports under some
// labels.
package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Sample returns the value of the first series name{labels...} in g (a
// histogram's sample count), and whether there is one; a series matches
// when it carries every label given with the value given, whatever else
// it carries.
func Sample(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			n := 0
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v == lp.GetValue() {
					n++
				}
			}
			if n != len(labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue(), true
			case m.Gauge != nil:
				return m.GetGauge().GetValue(), true
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

// Want fails tb unless g exports name{labels...} with the value want.
func Want(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string, want float64) {
	tb.Helper()
	got, ok := Sample(tb, g, name, labels)
	if !ok || got != want {
		tb.Errorf("%s%v = %v (exported: %v), want %v", name, labels, got, ok, want)
	}
}
