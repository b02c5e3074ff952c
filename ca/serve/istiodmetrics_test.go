package serve

import (
	"testing"

	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/internal/metricstest"
	"github.com/prometheus/client_golang/prometheus"
)

// TestIstiodRefusedMetric: meshca_istiod_certificate_refused is exported
// at 0 for every reason from the start (the alert reads it), 1 for the
// reason the keeper refuses the Secret now, and 0 again once it may
// write it.
func TestIstiodRefusedMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newIstiodMetrics(reg)
	want := func(refused string) {
		t.Helper()
		for _, r := range istiodcert.RefusalReasons {
			v := 0.0
			if r == refused {
				v = 1
			}
			metricstest.Want(t, reg, "meshca_istiod_certificate_refused", map[string]string{"reason": r}, v)
		}
	}
	want("")
	m.Refused(istiodcert.RefusedCertManager)
	want(istiodcert.RefusedCertManager)
	m.Refused(istiodcert.RefusedCAKey)
	want(istiodcert.RefusedCAKey)
	m.Refused("")
	want("")
}
