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
}

func (f *podCertFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.signer, "pod-certificate-signer-name", "", "sign the PodCertificateRequests of this signer name (e.g. meshca.io/svid) with the Pod's SPIFFE ID, and publish the ClusterTrustBundle linked to it; one replica signs, elected on the Lease "+serve.PodCertificateLease+" in --trust-lease-namespace; empty: off")
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
	if ctb.signer != "" && ctb.signer != f.signer {
		return c, fmt.Errorf("--cluster-trust-bundle-signer-name %s must be empty or the --pod-certificate-signer-name %s: the Pods mount the bundle of their signer", ctb.signer, f.signer)
	}
	if _, err := labels.Parse(f.selector); err != nil {
		return c, fmt.Errorf("--pod-certificate-namespace-selector: %w", err)
	}
	return c, nil
}
