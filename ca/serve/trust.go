package serve

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/ca/trust/trustprom"
	"github.com/meshca/meshca/internal/pemutil"
)

// TrustLease is the Lease the replicas elect the trust publisher on.
const TrustLease = "meshca-trust-publisher"

// Trust says whether and where the trust bundle is published as the
// istio-ca-root-cert ConfigMap. istiod writes the same ConfigMap from its
// own CA, so this is off unless meshca replaces istiod's CA.
type Trust struct {
	Publish bool
	// Selector limits publishing to matching namespaces ("" means all).
	Selector string
	// Skip names namespaces never written to, besides the system ones.
	Skip []string
	// LeaseNamespace holds the Lease on which replicas elect the one that
	// writes.
	LeaseNamespace string
}

// newTrustRunner builds the leader-elected publisher of the bundle that
// be serves, and returns it with the function that tells it of a change.
func newTrustRunner(c Trust, td spiffeid.TrustDomain, client kubernetes.Interface, be *backend, reg prometheus.Registerer,
	log *slog.Logger) (func(context.Context) error, func(), error) {
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
	pub, err := trust.NewPublisher(trust.Config{Client: client, Selector: sel, Skip: c.Skip, Logger: log, Observer: counter,
		Bundle: func() []byte {
			b, err := be.bundles.GetX509BundleForTrustDomain(td)
			if err != nil {
				return nil
			}
			return pemutil.EncodeCertificates(b.X509Authorities()...)
		}})
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	identity := host + "-" + rand.String(6)
	run := func(ctx context.Context) error {
		return trust.RunLeaderElected(ctx, client, c.LeaseNamespace, TrustLease, identity, pub.Run, log)
	}
	return run, pub.BundleChanged, nil
}
