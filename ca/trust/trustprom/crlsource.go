package trustprom

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of a read of a backend's CRLs.
const (
	CRLSourceOK    = "ok"
	CRLSourceError = "error"
)

// CRLSource counts the reads of the CRLs a backend keeps itself (Vault
// PKI's), which meshca publishes as they are:
// meshca_trust_crl_source_reads_total{backend,result}, and
// meshca_trust_crl_source_last_success_timestamp_seconds{backend}, when
// the last read succeeded (while reads fail, the last CRLs read stay
// published).
type CRLSource struct {
	backend string
	reads   *prometheus.CounterVec
	last    *prometheus.GaugeVec
}

// NewCRLSource creates the metrics of backend's CRLs and registers them
// with reg.
func NewCRLSource(reg prometheus.Registerer, backend string) (*CRLSource, error) {
	s := &CRLSource{backend: backend,
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshca_trust_crl_source_reads_total",
			Help: "Reads of the CRLs a signing backend keeps (Vault PKI), by result (ok, error); while they fail, the last CRLs read stay published."},
			[]string{"backend", "result"}),
		last: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshca_trust_crl_source_last_success_timestamp_seconds",
			Help: "When (Unix seconds) this replica last read the CRLs of its signing backend."}, []string{"backend"}),
	}
	for _, c := range []prometheus.Collector{s.reads, s.last} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("trustprom: %w", err)
		}
	}
	for _, r := range []string{CRLSourceOK, CRLSourceError} {
		s.reads.WithLabelValues(backend, r)
	}
	return s, nil
}

// Read counts one read of the backend's CRLs that ended at t with result.
func (s *CRLSource) Read(result string, t time.Time) {
	s.reads.WithLabelValues(s.backend, result).Inc()
	if result == CRLSourceOK {
		s.last.WithLabelValues(s.backend).Set(float64(t.Unix()))
	}
}
