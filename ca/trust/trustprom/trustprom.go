// Package trustprom counts the trust publishers' writes in Prometheus. It
// is apart from package trust so that trust's users need not link
// Prometheus.
package trustprom

import (
	"fmt"

	"github.com/meshca/meshca/ca/trust"
	"github.com/prometheus/client_golang/prometheus"
)

// The kinds of object the publishers write, the kind label.
const (
	KindConfigMap          = "configmap"
	KindClusterTrustBundle = "clustertrustbundle"
)

// results are the series each kind starts with, at zero.
var results = map[string][]string{
	KindConfigMap: {trust.ResultCreated, trust.ResultUpdated, trust.ResultConflict, trust.ResultForbidden, trust.ResultStale, trust.ResultError},
	KindClusterTrustBundle: {trust.ResultCreated, trust.ResultUpdated, trust.ResultConflict, trust.ResultForbidden,
		trust.ResultInvalid, trust.ResultNotOwned, trust.ResultStale, trust.ResultError},
}

// Counter is the counter meshca_trust_writes_total{kind,result}; Kind
// gives each publisher its trust.Observer.
type Counter struct {
	writes *prometheus.CounterVec
}

// New creates the counter and registers it with reg.
func New(reg prometheus.Registerer) (*Counter, error) {
	c := &Counter{writes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshca_trust_writes_total",
		Help: "Writes of the published trust bundle by kind (configmap: istio-ca-root-cert; clustertrustbundle) and result " +
			"(created, updated, conflict, forbidden, invalid, not_owned, stale: not written over a newer bundle, error).",
	}, []string{"kind", "result"})}
	if err := reg.Register(c.writes); err != nil {
		return nil, fmt.Errorf("trustprom: %w", err)
	}
	for kind, rs := range results {
		for _, r := range rs {
			c.writes.WithLabelValues(kind, r)
		}
	}
	return c, nil
}

// Kind returns the trust.Observer counting writes of objects of kind.
func (c *Counter) Kind(kind string) trust.Observer { return observer{c: c, kind: kind} }

type observer struct {
	c    *Counter
	kind string
}

// ObserveWrite implements trust.Observer.
func (o observer) ObserveWrite(result string) { o.c.writes.WithLabelValues(o.kind, result).Inc() }
