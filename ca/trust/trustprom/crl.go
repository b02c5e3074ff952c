package trustprom

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CRLExpiry reports the CRLs this replica last published (istio-ca-crl):
// meshca_trust_crl_next_update_timestamp_seconds, the earliest nextUpdate
// among them, and meshca_trust_crl_this_update_timestamp_seconds, the
// thisUpdate of that same CRL, so that an alert can compare what is left
// of it with its validity. Both are present only while this replica
// publishes CRLs (it leads, and has some): past nextUpdate ztunnel stops
// enforcing revocation.
type CRLExpiry struct {
	next, this *prometheus.Desc

	mu       sync.Mutex
	digest   [sha256.Size]byte
	set      bool
	earliest struct{ this, next time.Time }
}

// NewCRLExpiry creates the gauges and registers them with reg.
func NewCRLExpiry(reg prometheus.Registerer) (*CRLExpiry, error) {
	e := &CRLExpiry{
		next: prometheus.NewDesc("meshca_trust_crl_next_update_timestamp_seconds",
			"The earliest nextUpdate (Unix seconds) among the CRLs this replica last published as istio-ca-crl; "+
				"present while it publishes them.", nil, nil),
		this: prometheus.NewDesc("meshca_trust_crl_this_update_timestamp_seconds",
			"The thisUpdate (Unix seconds) of the published CRL with the earliest nextUpdate; present while "+
				"this replica publishes CRLs.", nil, nil),
	}
	if err := reg.Register(e); err != nil {
		return nil, fmt.Errorf("trustprom: %w", err)
	}
	return e, nil
}

// Published takes the CRL bundle a namespace holds (PEM CRLs, or one DER
// CRL), or nil when this replica stops publishing; it is
// trust.Config.Published. A bundle read before is not parsed again.
func (e *CRLExpiry) Published(bundle []byte) {
	sum := sha256.Sum256(bundle)
	e.mu.Lock()
	defer e.mu.Unlock()
	if bundle != nil && e.set && sum == e.digest {
		return
	}
	e.digest, e.set = sum, false
	for _, crl := range parseCRLs(bundle) {
		if !e.set || crl.NextUpdate.Before(e.earliest.next) {
			e.earliest.this, e.earliest.next, e.set = crl.ThisUpdate, crl.NextUpdate, true
		}
	}
}

// parseCRLs returns the CRLs of bundle that parse: its PEM blocks of type
// X509 CRL, or bundle as one DER CRL when it has no PEM block.
func parseCRLs(bundle []byte) []*x509.RevocationList {
	var out []*x509.RevocationList
	rest, sawPEM := bundle, false
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		sawPEM = true
		if block.Type != "X509 CRL" {
			continue
		}
		if crl, err := x509.ParseRevocationList(block.Bytes); err == nil {
			out = append(out, crl)
		}
	}
	if !sawPEM && len(bundle) > 0 {
		if crl, err := x509.ParseRevocationList(bundle); err == nil {
			out = append(out, crl)
		}
	}
	return out
}

// Describe implements prometheus.Collector.
func (e *CRLExpiry) Describe(ch chan<- *prometheus.Desc) {
	ch <- e.next
	ch <- e.this
}

// Collect implements prometheus.Collector.
func (e *CRLExpiry) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.set {
		return
	}
	ch <- prometheus.MustNewConstMetric(e.next, prometheus.GaugeValue, unixSeconds(e.earliest.next))
	ch <- prometheus.MustNewConstMetric(e.this, prometheus.GaugeValue, unixSeconds(e.earliest.this))
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
