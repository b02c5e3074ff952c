// Package trustprom counts the trust publisher's writes in Prometheus. It
// is apart from package trust so that trust's users need not link
// Prometheus.
package trustprom

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshca/meshca/ca/trust"
)

// Counter is a trust.Observer backed by the counter
// meshca_trust_configmap_writes_total{result}.
type Counter struct {
	writes *prometheus.CounterVec
}

var _ trust.Observer = (*Counter)(nil)

// New creates the counter and registers it with reg.
func New(reg prometheus.Registerer) (*Counter, error) {
	c := &Counter{writes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshca_trust_configmap_writes_total",
		Help: "Writes of the istio-ca-root-cert ConfigMap by result (created, updated, conflict, forbidden, error).",
	}, []string{"result"})}
	if err := reg.Register(c.writes); err != nil {
		return nil, fmt.Errorf("trustprom: %w", err)
	}
	for _, r := range []string{trust.ResultCreated, trust.ResultUpdated, trust.ResultConflict, trust.ResultForbidden, trust.ResultError} {
		c.writes.WithLabelValues(r)
	}
	return c, nil
}

// ObserveWrite implements trust.Observer.
func (c *Counter) ObserveWrite(result string) { c.writes.WithLabelValues(result).Inc() }
