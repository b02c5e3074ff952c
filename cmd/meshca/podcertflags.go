package main

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/signer/k8scsr"
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
	if f.backend() == signerK8sCSR {
		return c, errPodCertK8sCSR
	}
	if ctb.signer != "" && ctb.signer != f.signer {
		return c, fmt.Errorf("--cluster-trust-bundle-signer-name %s must be empty or the --pod-certificate-signer-name %s: the Pods mount the bundle of their signer", ctb.signer, f.signer)
	}
	if _, err := labels.Parse(f.selector); err != nil {
		return c, fmt.Errorf("--pod-certificate-namespace-selector: %w", err)
	}
	return c, nil
}

// errPodCertK8sCSR refuses pod certificates signed through
// CertificateSigningRequests (serve refuses them too).
var errPodCertK8sCSR = errors.New("--pod-certificate-signer-name cannot be used with --signer k8scsr: " +
	"the kubelet's stub CSR carries no name, the k8scsr signer hands the CSR as it is to the external signer, " +
	"and the Pod's SPIFFE ID would only ride in the " + k8scsr.AnnotationSPIFFEID + " annotation, which anyone who may create a CertificateSigningRequest can set; " +
	"sign pod certificates with the local, cfssl or vault signer")

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
