// Package trustprom counts the trust publishers' writes in Prometheus,
// and reports when the CRLs last published expire (CRLExpiry). It
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

// The documents the publishers write, the document label: the trust
// bundle (istio-ca-root-cert, the ClusterTrustBundle) and the CRLs
// (istio-ca-crl).
const (
	DocumentBundle = "bundle"
	DocumentCRL    = "crl"
)

// writer is one publisher's series: the kind of object and its document.
type writer struct{ kind, document string }

// results are the series each publisher starts with, at zero (Document).
var results = map[writer][]string{
	{KindConfigMap, DocumentBundle}: configMapResults,
	{KindConfigMap, DocumentCRL}:    configMapResults,
	{KindClusterTrustBundle, DocumentBundle}: {trust.ResultCreated, trust.ResultUpdated, trust.ResultConflict, trust.ResultForbidden,
		trust.ResultInvalid, trust.ResultNotOwned, trust.ResultStale, trust.ResultError},
}

var configMapResults = []string{trust.ResultCreated, trust.ResultUpdated, trust.ResultConflict, trust.ResultForbidden,
	trust.ResultStale, trust.ResultError}

// Counter is the counter meshca_trust_writes_total{kind,document,result};
// Kind and Document give each publisher its trust.Observer.
type Counter struct {
	writes *prometheus.CounterVec
}

// New creates the counter and registers it with reg.
func New(reg prometheus.Registerer) (*Counter, error) {
	c := &Counter{writes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshca_trust_writes_total",
		Help: "Writes of the published trust bundle and CRLs by kind (configmap, clustertrustbundle), document " +
			"(bundle: istio-ca-root-cert and the ClusterTrustBundle; crl: istio-ca-crl) and result " +
			"(created, updated, conflict, forbidden, invalid, not_owned, stale: not written over a newer bundle, error).",
	}, []string{"kind", "document", "result"})}
	if err := reg.Register(c.writes); err != nil {
		return nil, fmt.Errorf("trustprom: %w", err)
	}
	return c, nil
}

// Kind returns the trust.Observer counting writes of the trust bundle as
// objects of kind.
func (c *Counter) Kind(kind string) trust.Observer { return c.Document(kind, DocumentBundle) }

// Document returns the trust.Observer counting writes of document as
// objects of kind, and starts its series at zero: only the publishers
// that run export theirs, so a query of one kind's results finds one
// series each.
func (c *Counter) Document(kind, document string) trust.Observer {
	w := writer{kind, document}
	for _, r := range results[w] {
		c.writes.WithLabelValues(kind, document, r)
	}
	return observer{c: c, w: w}
}

type observer struct {
	c *Counter
	w writer
}

// ObserveWrite implements trust.Observer.
func (o observer) ObserveWrite(result string) {
	o.c.writes.WithLabelValues(o.w.kind, o.w.document, result).Inc()
}
