package serve

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/ca/trust/trustprom"
	"github.com/meshca/meshca/internal/pemutil"
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
func (c Trust) enabled() bool { return c.Publish || c.ClusterTrustBundle }

// newTrustRunner builds the leader-elected publishers of the bundle that
// be serves, and returns them with the function that tells them of a
// change.
func newTrustRunner(c Trust, td spiffeid.TrustDomain, client kubernetes.Interface, be *backend, reg prometheus.Registerer,
	leaders *ca.LeaderMetrics, log *slog.Logger) (func(context.Context) error, func(), error) {
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
	bundle := func() []byte {
		b, err := be.bundles.GetX509BundleForTrustDomain(td)
		if err != nil {
			return nil
		}
		return pemutil.EncodeCertificates(b.X509Authorities()...)
	}
	var runs []func(context.Context) error
	var changed []func()
	if c.Publish {
		pub, err := trust.NewPublisher(trust.Config{Client: client, Selector: sel, Skip: c.Skip, Logger: log,
			Observer: counter.Kind(trustprom.KindConfigMap), Bundle: bundle})
		if err != nil {
			return nil, nil, err
		}
		runs, changed = append(runs, pub.Run), append(changed, pub.BundleChanged)
	}
	if c.ClusterTrustBundle {
		pub, err := trust.NewClusterTrustBundlePublisher(trust.ClusterTrustBundleConfig{Client: client, Bundle: bundle,
			TrustDomain: td, SignerName: c.ClusterTrustBundleSigner, Logger: log,
			Observer: counter.Kind(trustprom.KindClusterTrustBundle)})
		if err != nil {
			field := "trust-domain"
			if c.ClusterTrustBundleSigner != "" {
				field = "cluster-trust-bundle-signer-name"
			}
			return nil, nil, &FieldError{Field: field, Err: err}
		}
		runs, changed = append(runs, pub.Run), append(changed, pub.BundleChanged)
	}
	host, _ := os.Hostname()
	identity := host + "-" + rand.String(6)
	lead := func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		for _, run := range runs {
			g.Go(func() error { return run(ctx) })
		}
		return g.Wait()
	}
	leading := leaders.Lease(TrustLease)
	run := func(ctx context.Context) error {
		return trust.RunLeaderElected(ctx, client, c.LeaseNamespace, TrustLease, identity, lead, log, leading)
	}
	return run, func() {
		for _, f := range changed {
			f()
		}
	}, nil
}
