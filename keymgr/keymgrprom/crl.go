package keymgrprom

import (
	"github.com/meshca/meshca/keymgr"
	"github.com/prometheus/client_golang/prometheus"
)

// crlMetrics show the CRLs of the CA state and its revocations: the
// nextUpdate of each CA's CRL and how many certificates and nodes are
// revoked, on every replica (they follow one CA state), and the CRLs
// issued, on the replica that keeps them (meshca serve --crl).
type crlMetrics struct {
	issued      *prometheus.CounterVec
	thisUpdate  *prometheus.GaugeVec
	nextUpdate  *prometheus.GaugeVec
	revocations *prometheus.GaugeVec
}

// Results of a CRL issue, as meshca_crl_issued_total counts them.
const (
	CRLIssuedOK    = "ok"
	CRLIssuedError = "error"
)

// Kinds of revocation, as meshca_revocations counts them.
const (
	RevocationCertificate = "certificate"
	RevocationNode        = "node"
)

func newCRLMetrics(reg prometheus.Registerer) crlMetrics {
	m := crlMetrics{
		issued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshca_crl_issued_total", Help: "CRLs this replica issued into the CA state, by result (ok; error: signing failed or meshca cannot sign that CA's CRL).",
		}, []string{"result"}),
		thisUpdate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshca_crl_this_update_timestamp_seconds", Help: "Unix time the CRL of each CA of the CA state in service was issued (its thisUpdate, backdated a little), by issuer id (16 hex digits).",
		}, []string{"issuer"}),
		nextUpdate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshca_crl_next_update_timestamp_seconds", Help: "Unix time the CRL of each CA of the CA state in service stops being valid (its nextUpdate), by issuer id (16 hex digits).",
		}, []string{"issuer"}),
		revocations: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshca_revocations", Help: "Revocations in the CA state in service, by kind: certificate (revoked and not yet expired), node (nodes blocked from new certificates).",
		}, []string{"kind"}),
	}
	for _, r := range []string{CRLIssuedOK, CRLIssuedError} {
		m.issued.WithLabelValues(r)
	}
	reg.MustRegister(m.issued, m.thisUpdate, m.nextUpdate, m.revocations)
	return m
}

// observe records the CRLs and revocations of s.
func (m crlMetrics) observe(s *keymgr.State) {
	m.thisUpdate.Reset()
	m.nextUpdate.Reset()
	for _, c := range s.CRLs {
		m.thisUpdate.WithLabelValues(c.Issuer[:16]).Set(float64(c.ThisUpdate.Unix()))
		m.nextUpdate.WithLabelValues(c.Issuer[:16]).Set(float64(c.NextUpdate.Unix()))
	}
	m.revocations.WithLabelValues(RevocationCertificate).Set(float64(len(s.Revocations)))
	m.revocations.WithLabelValues(RevocationNode).Set(float64(len(s.Blocked)))
}

// CRLIssued counts a CRL issue with result (CRLIssuedOK or
// CRLIssuedError).
func (m *Metrics) CRLIssued(result string) { m.crl.issued.WithLabelValues(result).Inc() }
