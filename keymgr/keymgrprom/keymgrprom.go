// Package keymgrprom exports where the CA state's root rotation and its
// intermediate's renewal stand as Prometheus metrics; the state
// follower, the rotator and the renewer feed it; and the serving
// certificate meshca presents (serving.go).
package keymgrprom

import (
	"github.com/meshca/meshca/keymgr"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics show where the CA state's root rotation stands: the
// bundle's sequence number, how many authorities are in each phase, when
// each trusted root expires, and the steps taken and refused.
type Metrics struct {
	sequence  prometheus.Gauge
	phases    *prometheus.GaugeVec
	rootAfter *prometheus.GaugeVec
	steps     *prometheus.CounterVec
	unusable  prometheus.Counter
	inter     intermediateMetrics
	crl       crlMetrics
}

// New registers the collectors with reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sequence: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshca_trust_bundle_sequence", Help: "Sequence number of the trust bundle in service; it only grows.",
		}),
		phases: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshca_ca_authorities", Help: "Authorities of the CA state in service, by phase.",
		}, []string{"phase"}),
		rootAfter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshca_ca_root_expiry_timestamp", Help: "Unix time each trusted root expires, by authority id and phase.",
		}, []string{"authority", "phase"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshca_rotation_steps_total", Help: "Automatic rotation steps taken, by verb.",
		}, []string{"verb"}),
		unusable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshca_ca_state_unusable_total", Help: "Stored CA states not put in service: they did not load or validate, or would take back the one in service (an older sequence, a retired authority again, another lineage); counted once per failure that differs from the one before.",
		}),
	}
	for _, p := range []keymgr.Phase{keymgr.PhasePrepared, keymgr.PhaseActive, keymgr.PhasePrevious, keymgr.PhaseRetired} {
		m.phases.WithLabelValues(string(p))
	}
	for _, v := range []string{keymgr.VerbPrepare, keymgr.VerbActivate, keymgr.VerbRetire} {
		m.steps.WithLabelValues(v)
	}
	reg.MustRegister(m.sequence, m.phases, m.rootAfter, m.steps, m.unusable)
	m.inter = newIntermediateMetrics(reg)
	m.crl = newCRLMetrics(reg)
	return m
}

// Observe records the state put in service.
func (m *Metrics) Observe(s *keymgr.State) {
	m.sequence.Set(float64(s.Sequence))
	counts := map[keymgr.Phase]int{keymgr.PhasePrepared: 0, keymgr.PhaseActive: 0, keymgr.PhasePrevious: 0, keymgr.PhaseRetired: 0}
	m.rootAfter.Reset()
	for _, a := range s.Authorities {
		counts[a.Phase]++
		if a.Phase != keymgr.PhaseRetired {
			m.rootAfter.WithLabelValues(a.ID()[:16], string(a.Phase)).Set(float64(a.Root.NotAfter.Unix()))
		}
	}
	for p, n := range counts {
		m.phases.WithLabelValues(string(p)).Set(float64(n))
	}
	m.inter.observe(s)
	m.crl.observe(s)
}

// Step counts an automatic rotation step.
func (m *Metrics) Step(verb string) { m.steps.WithLabelValues(verb).Inc() }

// Unusable counts a stored state that was not put in service.
func (m *Metrics) Unusable() { m.unusable.Inc() }
