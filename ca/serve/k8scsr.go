package serve

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"

	"github.com/meshca/meshca/signer/k8scsr"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// K8sCSR configures the CertificateSigningRequest backend.
type K8sCSR struct {
	// SignerName is spec.signerName of the requests meshca creates.
	SignerName string
	// Kubeconfig is the cluster the requests go to; empty means the local
	// cluster's (Clusters.LocalKubeconfig, in-cluster when that is empty).
	Kubeconfig string
}

// newK8sCSR is the CertificateSigningRequest signer, and a probe of its
// apiserver (its version); bundles, read at every request, is the trust
// bundle the backend is built with.
func newK8sCSR(c K8sCSR, localKubeconfig string, td spiffeid.TrustDomain, bundles func() x509bundle.Source,
	log *slog.Logger) (*k8scsr.Signer, func(context.Context) error, error) {
	kubeconfig := c.Kubeconfig
	if kubeconfig == "" {
		kubeconfig = localKubeconfig
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	probe := func(ctx context.Context) error {
		_, err := client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
		return err
	}
	s, err := k8scsr.New(k8scsr.Config{
		Client: client, SignerName: c.SignerName,
		Roots: func() []*x509.Certificate {
			b, err := bundles().GetX509BundleForTrustDomain(td)
			if err != nil {
				return nil
			}
			return b.X509Authorities()
		},
		OnDeleteError: func(err error) { log.Warn("CertificateSigningRequest left behind", "error", err) },
	})
	return s, probe, err
}
