package keymgrprom

import (
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/prometheus/client_golang/prometheus"
)

// intermediateMetrics show the signing intermediate meshca renews from
// an upstream (meshca serve --upstream): when the one in service starts
// and ends, on every replica (they follow one CA state), and how the
// renewals fare, on the replica that renews.
type intermediateMetrics struct {
	start, end *prometheus.GaugeVec
	renewals   *prometheus.CounterVec
	success    *prometheus.GaugeVec
	failures   *prometheus.GaugeVec
}

// Results of a renewal, as meshca_intermediate_renewals_total counts
// them: RenewOK, or the upstream.Kind of the failure.
const RenewOK = "ok"

func newIntermediateMetrics(reg prometheus.Registerer) intermediateMetrics {
	m := intermediateMetrics{
		start: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshca_intermediate_start_timestamp", Help: "Unix time the signing intermediate in service starts (its NotBefore), by upstream.",
		}, []string{"upstream"}),
		end: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshca_intermediate_expiry_timestamp", Help: "Unix time the signing intermediate in service expires (its NotAfter), by upstream: no leaf outlives it.",
		}, []string{"upstream"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshca_intermediate_renewals_total", Help: "Renewals of the signing intermediate attempted by this replica, by upstream and result (ok, unavailable, refused, internal).",
		}, []string{"upstream", "result"}),
		success: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshca_intermediate_renewal_success_timestamp", Help: "Unix time of this replica's last successful renewal of the signing intermediate, by upstream.",
		}, []string{"upstream"}),
		failures: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshca_intermediate_renewal_failures", Help: "Failed renewals of the signing intermediate in a row on this replica, by upstream; 0 once one succeeds.",
		}, []string{"upstream"}),
	}
	reg.MustRegister(m.start, m.end, m.renewals, m.success, m.failures)
	return m
}

// observe records the intermediate of s's active authority, when meshca
// renews it.
func (m intermediateMetrics) observe(s *keymgr.State) {
	m.start.Reset()
	m.end.Reset()
	a := s.Active()
	if a == nil || !a.Renewed() {
		return
	}
	m.start.WithLabelValues(a.Upstream.Type).Set(float64(a.Cert.NotBefore.Unix()))
	m.end.WithLabelValues(a.Upstream.Type).Set(float64(a.Cert.NotAfter.Unix()))
}

// Renewal counts an attempt to renew from upstream with result (RenewOK
// or the failure's kind) at now; failures is how many failed in a row.
func (m *Metrics) Renewal(upstream, result string, failures int, now time.Time) {
	m.inter.renewals.WithLabelValues(upstream, result).Inc()
	m.inter.failures.WithLabelValues(upstream).Set(float64(failures))
	if result == RenewOK {
		m.inter.success.WithLabelValues(upstream).Set(float64(now.Unix()))
	}
}

// RenewerStarted shows that this replica renews from upstream, with no
// failure yet: the series the alerts read exist before the first
// renewal.
func (m *Metrics) RenewerStarted(upstream string) {
	m.inter.failures.WithLabelValues(upstream).Set(0)
	m.inter.renewals.WithLabelValues(upstream, RenewOK)
}

// RenewerStopped forgets this replica's count of failures in a row from
// upstream: another replica renews now (leadership moved), and a stale
// count would keep an alert firing.
func (m *Metrics) RenewerStopped(upstream string) { m.inter.failures.DeleteLabelValues(upstream) }
