package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/leader/leaderprom"
	"github.com/meshca/meshca/ca/podcert"
	"github.com/meshca/meshca/ca/trust"
)

// PodCertificateLease is the Lease the replicas elect the
// PodCertificateRequest signer on.
const PodCertificateLease = "meshca-pod-certificate-signer"

// PodCertificates configures the PodCertificateRequest signer: off when
// SignerName is empty. Its ClusterTrustBundle, linked to the same signer
// name, is published by the trust publisher (Trust).
type PodCertificates struct {
	SignerName string
	// NamespaceSelector is a label selector of the namespaces whose Pods
	// may get certificates; empty allows all.
	NamespaceSelector string
}

// linkTrust makes the trust publisher publish the ClusterTrustBundle of
// the pod certificate signer's name: Pods mount it by that name.
func (c PodCertificates) linkTrust(t *Trust) error {
	if c.SignerName == "" {
		return nil
	}
	if err := trust.ValidateSignerName(c.SignerName); err != nil {
		return &FieldError{Field: "pod-certificate-signer-name", Err: err}
	}
	if t.ClusterTrustBundleSigner != "" && t.ClusterTrustBundleSigner != c.SignerName {
		return &FieldError{Field: "cluster-trust-bundle-signer-name",
			Err: errors.New("must be the --pod-certificate-signer-name, " + c.SignerName + ", or empty")}
	}
	t.ClusterTrustBundle, t.ClusterTrustBundleSigner = true, c.SignerName
	return nil
}

// newPodCertRunner builds the PodCertificateRequest controller, which
// issues through srv unless the external backend ext (nil: the built-in
// CA) refuses pod certificates, and returns it elected on PodCertificateLease in
// leaseNS.
func newPodCertRunner(c PodCertificates, ext External, td spiffeid.TrustDomain, client kubernetes.Interface, srv *ca.Server,
	leaseNS string, reg prometheus.Registerer, leaders *leaderprom.Metrics, log *slog.Logger) (func(context.Context) error, error) {
	if ext != nil {
		if err := ext.PodCertificates(); err != nil {
			return nil, &FieldError{Field: "pod-certificate-signer-name", Err: fmt.Errorf("cannot be used with the %s signer (--signer %[1]s): %w", ext.Name(), err)}
		}
	}
	if client == nil {
		return nil, &FieldError{Field: "pod-certificate-signer-name", Err: errors.New("needs the local cluster")}
	}
	if leaseNS == "" {
		return nil, &FieldError{Field: "trust-lease-namespace", Err: errors.New("the pod certificate signer needs the namespace of its Lease")}
	}
	sel := labels.Everything()
	if c.NamespaceSelector != "" {
		var err error
		if sel, err = labels.Parse(c.NamespaceSelector); err != nil {
			return nil, &FieldError{Field: "pod-certificate-namespace-selector", Err: err}
		}
	}
	cfg := podcert.Config{Client: client, SignerName: c.SignerName, TrustDomain: td,
		Issuer: ca.NewPodIssuer(srv, reg), Namespaces: sel, MaxTTL: srv.PodTTL(), Logger: log}
	if _, err := podcert.New(cfg); err != nil {
		return nil, &FieldError{Field: "pod-certificate-signer-name", Err: err}
	}
	// A controller runs once: each term of leadership gets its own.
	lead := func(ctx context.Context) error {
		ctl, err := podcert.New(cfg)
		if err != nil {
			return err
		}
		return ctl.Run(ctx)
	}
	return func(ctx context.Context) error {
		return campaign(ctx, client, leaseNS, PodCertificateLease, lead, leaders, log)
	}, nil
}
