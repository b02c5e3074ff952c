package main

import (
	"errors"
	"fmt"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/ca/trust"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// ctbFlags are the flags of the ClusterTrustBundle publisher.
type ctbFlags struct {
	publish bool
	signer  string
}

func (f *ctbFlags) register(fl *pflag.FlagSet) {
	fl.BoolVar(&f.publish, "publish-cluster-trust-bundle", false, "also publish the trust bundle as a ClusterTrustBundle (certificates.k8s.io v1, else v1beta1 or v1alpha1; skipped with a log line when the apiserver serves none), named meshca-<trust domain>, or <signer name with '/' as ':'>:<trust domain> with --cluster-trust-bundle-signer-name; written by the replica elected on the Lease "+serve.TrustLease)
	fl.StringVar(&f.signer, "cluster-trust-bundle-signer-name", "", "link the ClusterTrustBundle to this signer name (e.g. meshca.io/svid; needs the attest verb on it), so Pods mount it by signerName and the label "+trust.LabelTrustDomain+"=<trust domain>; empty: linked to no signer")
}

// validate checks the flags against the trust domain, without I/O.
func (f *ctbFlags) validate(td spiffeid.TrustDomain) error {
	switch {
	case f.signer != "" && !f.publish:
		return errors.New("--cluster-trust-bundle-signer-name needs --publish-cluster-trust-bundle")
	case !f.publish:
		return nil
	}
	if f.signer != "" {
		if err := trust.ValidateSignerName(f.signer); err != nil {
			return fmt.Errorf("--cluster-trust-bundle-signer-name: %w", err)
		}
	}
	if _, err := trust.ClusterTrustBundleName(f.signer, td); err != nil {
		return fmt.Errorf("--publish-cluster-trust-bundle with --trust-domain %s: %w", td.Name(), err)
	}
	return nil
}
