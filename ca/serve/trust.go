package serve

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/meshca/meshca/ca/leader/leaderprom"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/ca/trust/trustprom"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
)

// TrustLease is the Lease the replicas elect the trust publisher on.
const TrustLease = "meshca-trust-publisher"

// Trust says whether and where the trust bundle is published: as the
// istio-ca-root-cert ConfigMap (Publish; istiod writes the same ConfigMap
// from its own CA, so this is off unless meshca replaces istiod's CA),
// and as a ClusterTrustBundle (ClusterTrustBundle). One replica, elected
// on the Lease TrustLease, writes both.
type Trust struct {
	Publish bool
	// CRL publishes the CA state's revocation lists as the istio-ca-crl
	// ConfigMap in the same namespaces (keymgr.View.CRLBundlePEM); nothing
	// is written while the state has none. With an external backend that
	// keeps its own CRLs (Vault), they are the backend's, read every
	// CRLPoll (DefaultCRLPoll when zero); with another external backend,
	// refused.
	CRL     bool
	CRLPoll time.Duration
	// ClusterTrustBundle publishes the bundle as a ClusterTrustBundle too,
	// when the apiserver serves that API.
	ClusterTrustBundle bool
	// ClusterTrustBundleSigner links that ClusterTrustBundle to a signer
	// name (and names it after it); empty links it to none.
	ClusterTrustBundleSigner string
	// Selector limits publishing to matching namespaces ("" means all).
	Selector string
	// Skip names namespaces never written to, besides the system ones.
	Skip []string
	// LeaseNamespace holds the Lease on which replicas elect the one that
	// writes.
	LeaseNamespace string
}

// enabled reports whether anything is published.
func (c Trust) enabled() bool { return c.Publish || c.CRL || c.ClusterTrustBundle }

// trustPublisher is one of the publishers a term of leadership runs.
type trustPublisher interface {
	Run(ctx context.Context) error
	BundleChanged()
}

// newTrustRunner builds the publishers of the bundle that be serves,
// elected on TrustLease, and returns them with the function that tells
// them of a change. A publisher runs once: each term of leadership gets
// its own, so a replica that loses the Lease stops publishing, serves on
// and campaigns again.
func newTrustRunner(c Trust, td spiffeid.TrustDomain, client kubernetes.Interface, be *backend, reg prometheus.Registerer,
	leaders *leaderprom.Metrics, log *slog.Logger) (func(context.Context) error, func(), error) {
	sel := labels.Everything()
	if c.Selector != "" {
		var err error
		if sel, err = labels.Parse(c.Selector); err != nil {
			return nil, nil, &FieldError{Field: "trust-namespace-selector", Err: err}
		}
	}
	if c.LeaseNamespace == "" {
		return nil, nil, &FieldError{Field: "trust-lease-namespace", Err: fmt.Errorf("publishing needs the namespace of its Lease")}
	}
	counter, err := trustprom.New(reg)
	if err != nil {
		return nil, nil, err
	}
	bundle := func() trust.Bundle {
		var out trust.Bundle
		if v := be.version.Load(); v != nil {
			out.Version = *v
		}
		b, err := be.bundles.GetX509BundleForTrustDomain(td)
		if err != nil {
			return trust.Bundle{}
		}
		out.PEM = pemutil.EncodeCertificates(b.X509Authorities()...)
		return out
	}
	var builds []func(*trust.Mark) (trustPublisher, error)
	if c.Publish {
		cfg := trust.Config{Client: client, Selector: sel, Skip: c.Skip, Logger: log,
			Observer: counter.Kind(trustprom.KindConfigMap), Bundle: bundle}
		if builds, err = addConfigMapPublisher(builds, cfg); err != nil {
			return nil, nil, err
		}
	}
	var src *crlSource
	if c.CRL {
		if src, err = newBackendCRLs(c, be, reg, log); err != nil {
			return nil, nil, err
		}
		expiry, err := trustprom.NewCRLExpiry(reg)
		if err != nil {
			return nil, nil, err
		}
		cfg := trust.Config{Client: client, Document: trust.CRLDocument, Selector: sel, Skip: c.Skip, Logger: log,
			Observer: counter.Document(trustprom.KindConfigMap, trustprom.DocumentCRL), Bundle: be.crlBundle,
			Published: expiry.Published}
		if builds, err = addConfigMapPublisher(builds, cfg); err != nil {
			return nil, nil, err
		}
	}
	if c.ClusterTrustBundle {
		cfg := trust.ClusterTrustBundleConfig{Client: client, Bundle: bundle,
			TrustDomain: td, SignerName: c.ClusterTrustBundleSigner, Logger: log,
			Observer: counter.Kind(trustprom.KindClusterTrustBundle)}
		if _, err := trust.NewClusterTrustBundlePublisher(cfg); err != nil {
			field := "trust-domain"
			if c.ClusterTrustBundleSigner != "" {
				field = "cluster-trust-bundle-signer-name"
			}
			return nil, nil, &FieldError{Field: field, Err: err}
		}
		builds = append(builds, func(m *trust.Mark) (trustPublisher, error) {
			cfg := cfg
			cfg.Mark = m
			return trust.NewClusterTrustBundlePublisher(cfg)
		})
	}
	t := &trustTerms{builds: builds, newMark: func() *trust.Mark {
		return &trust.Mark{Client: client, Namespace: c.LeaseNamespace, Name: TrustLease}
	}}
	run := func(ctx context.Context) error {
		return campaign(ctx, client, c.LeaseNamespace, TrustLease, t.lead, leaders, log)
	}
	if src == nil {
		return run, t.bundleChanged, nil
	}
	// Every replica reads the backend's CRLs, so that a new leader
	// publishes them at once; a new CA state has them read again.
	src.changed = t.bundleChanged
	both := func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		g.Go(func() error { return src.Run(ctx) })
		g.Go(func() error { return run(ctx) })
		return g.Wait()
	}
	return both, func() { src.Kick(); t.bundleChanged() }, nil
}

// newBackendCRLs is the source of the CRLs to publish when an external
// backend keeps them (Vault), nil for the built-in CA (whose CRLs are the
// CA state's), and refuses a backend that keeps none.
func newBackendCRLs(c Trust, be *backend, reg prometheus.Registerer, log *slog.Logger) (*crlSource, error) {
	if be.name == BackendLocal {
		return nil, nil
	}
	if be.revoker == nil {
		return nil, &FieldError{Field: "publish-crl", Err: fmt.Errorf("--signer %s keeps no CRL meshca can publish: "+
			"only the built-in CA (--crl) and Vault have them (docs/backends.md)", be.name)}
	}
	metrics, err := trustprom.NewCRLSource(reg, be.name)
	if err != nil {
		return nil, err
	}
	src := newCRLSource(be, be.revoker, c.CRLPoll, metrics, log)
	be.crlSource = src
	return src, nil
}

// addConfigMapPublisher checks cfg and adds the build of a Publisher of
// it for each term.
func addConfigMapPublisher(builds []func(*trust.Mark) (trustPublisher, error), cfg trust.Config) (
	[]func(*trust.Mark) (trustPublisher, error), error) {
	if _, err := trust.NewPublisher(cfg); err != nil {
		return nil, err
	}
	return append(builds, func(m *trust.Mark) (trustPublisher, error) {
		cfg := cfg
		cfg.Mark = m
		return trust.NewPublisher(cfg)
	}), nil
}

// trustTerms runs a fresh set of publishers for each term of leadership
// and passes bundle changes to the current one. The publishers of a term
// share one Mark, on the Lease they were elected on.
type trustTerms struct {
	builds  []func(*trust.Mark) (trustPublisher, error)
	newMark func() *trust.Mark

	mu      sync.Mutex
	current []trustPublisher // nil between terms
}

// lead runs one term's publishers until ctx ends or one fails.
func (t *trustTerms) lead(ctx context.Context) error {
	pubs := make([]trustPublisher, 0, len(t.builds))
	mark := t.newMark()
	for _, build := range t.builds {
		p, err := build(mark)
		if err != nil {
			return err
		}
		pubs = append(pubs, p)
	}
	t.setCurrent(pubs)
	defer t.setCurrent(nil)
	g, ctx := errgroup.WithContext(ctx)
	for _, p := range pubs {
		g.Go(func() error { return p.Run(ctx) })
	}
	return g.Wait()
}

func (t *trustTerms) setCurrent(pubs []trustPublisher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.current = pubs
}

// bundleChanged tells the current term's publishers of a new bundle;
// between terms there is none to tell, and the next term's publishers
// write the bundle current when they start.
func (t *trustTerms) bundleChanged() {
	t.mu.Lock()
	pubs := t.current
	t.mu.Unlock()
	for _, p := range pubs {
		p.BundleChanged()
	}
}

// stateCRLs is the revocation lists of s to publish: every CRL the CA
// state keeps, PEM, concatenated; nil while it keeps none.
func stateCRLs(s *keymgr.State) []byte {
	return s.View().CRLBundlePEM()
}
