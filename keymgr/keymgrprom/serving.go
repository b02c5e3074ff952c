package keymgrprom

import (
	"crypto/x509"

	"github.com/meshca/meshca/keymgr"
	"github.com/prometheus/client_golang/prometheus"
)

// Result of a serving certificate reload that put the files' pair in
// service; the others are keymgr's Serving* reasons.
const ServingReloaded = "reloaded"

// ObserveServing registers the validity of the serving certificate
// meshca presents on its gRPC port, issued by itself or given in files:
// leaf returns it, nil before there is one.
func ObserveServing(reg prometheus.Registerer, leaf func() *x509.Certificate) {
	at := func(t func(*x509.Certificate) int64) func() float64 {
		return func() float64 {
			if l := leaf(); l != nil {
				return float64(t(l))
			}
			return 0
		}
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshca_serving_certificate_expiry_timestamp_seconds",
			Help: "Unix time the serving certificate of the gRPC port (the one new TLS handshakes get) expires.",
		}, at(func(l *x509.Certificate) int64 { return l.NotAfter.Unix() })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshca_serving_certificate_not_before_timestamp_seconds",
			Help: "Unix time the serving certificate of the gRPC port became valid: with the expiry, its lifetime.",
		}, at(func(l *x509.Certificate) int64 { return l.NotBefore.Unix() })))
}

// ServingReloads count what became of the serving certificate files
// (keymgr.ServingFiles) meshca follows.
type ServingReloads struct {
	results *prometheus.CounterVec
}

// NewServingReloads registers the reload counter and the gauge of
// whether the files hold a pair that is refused (failing), with reg.
func NewServingReloads(reg prometheus.Registerer, failing func() bool) *ServingReloads {
	m := &ServingReloads{results: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshca_serving_certificate_reloads_total",
		Help: "Serving certificate files looked at when they changed, by result: reloaded (put in service), or why they were refused " +
			"(unreadable, key_mismatch, not_yet_valid, expired, not_server, untrusted, names), counted once per failure that differs from the one before.",
	}, []string{"result"})}
	for _, r := range append([]string{ServingReloaded}, keymgr.ServingReasons...) {
		m.results.WithLabelValues(r)
	}
	reg.MustRegister(m.results, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "meshca_serving_certificate_reload_failing",
		Help: "Whether the serving certificate files hold a pair that is refused, the last good one serving (1), or not (0).",
	}, func() float64 {
		if failing() {
			return 1
		}
		return 0
	}))
	return m
}

// Reloaded counts a pair put in service.
func (m *ServingReloads) Reloaded() { m.results.WithLabelValues(ServingReloaded).Inc() }

// Refused counts a pair refused for reason, one of keymgr's Serving*.
func (m *ServingReloads) Refused(reason string) { m.results.WithLabelValues(reason).Inc() }
