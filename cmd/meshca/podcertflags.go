package main

import (
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/ca/trust"
)

// podCertFlags are the flags of the PodCertificateRequest signer.
type podCertFlags struct {
	signer   string
	selector string
	// fl is the flag set registered on, which also holds --signer.
	fl *pflag.FlagSet
}

func (f *podCertFlags) register(fl *pflag.FlagSet) {
	f.fl = fl
	fl.StringVar(&f.signer, "pod-certificate-signer-name", "", "sign the PodCertificateRequests of this signer name (e.g. meshca.io/svid) with the Pod's SPIFFE ID, and publish the ClusterTrustBundle linked to it; one replica signs, elected on the Lease "+serve.PodCertificateLease+" in --trust-lease-namespace; not with --signer k8scsr; empty: off")
	fl.StringVar(&f.selector, "pod-certificate-namespace-selector", "", "label selector of the namespaces whose Pods get pod certificates; others are Denied (NamespaceNotAllowed); empty: all")
}

// config checks the flags against the ClusterTrustBundle's, without I/O.
func (f *podCertFlags) config(ctb *ctbFlags) (serve.PodCertificates, error) {
	c := serve.PodCertificates{SignerName: f.signer, NamespaceSelector: f.selector}
	if f.signer == "" {
		if f.selector != "" {
			return c, fmt.Errorf("--pod-certificate-namespace-selector needs --pod-certificate-signer-name")
		}
		return c, nil
	}
	if err := trust.ValidateSignerName(f.signer); err != nil {
		return c, fmt.Errorf("--pod-certificate-signer-name: %w", err)
	}
	if b := signerNamed(f.backend()); b != nil && b.noPodCertificates != "" {
		return c, fmt.Errorf("--pod-certificate-signer-name cannot be used with --signer %s: %s; sign pod certificates with the %s signer",
			b.name, b.noPodCertificates, signerNames(func(b *signerBackend) bool { return b.noPodCertificates == "" }))
	}
	if ctb.signer != "" && ctb.signer != f.signer {
		return c, fmt.Errorf("--cluster-trust-bundle-signer-name %s must be empty or the --pod-certificate-signer-name %s: the Pods mount the bundle of their signer", ctb.signer, f.signer)
	}
	if _, err := labels.Parse(f.selector); err != nil {
		return c, fmt.Errorf("--pod-certificate-namespace-selector: %w", err)
	}
	return c, nil
}

// backend is the value of --signer, "" when it is not registered on the
// same flag set.
func (f *podCertFlags) backend() string {
	if f.fl == nil {
		return ""
	}
	if b := f.fl.Lookup("signer"); b != nil {
		return b.Value.String()
	}
	return ""
}
