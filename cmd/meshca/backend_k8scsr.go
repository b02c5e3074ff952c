package main

import (
	"fmt"
	"log/slog"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/signer/k8scsr"
	"github.com/spf13/pflag"
)

func init() {
	registerSigner(&signerBackend{
		name: serve.BackendK8sCSR, usage: "k8scsr (Kubernetes CertificateSigningRequests)",
		helpGroup: "k8scsr backend", keyFlags: []string{"k8scsr-signer-name", "k8scsr-kubeconfig"},
		serve: func() serveOptions { return &k8scsrFlags{} },
		noPodCertificates: "the kubelet's stub CSR carries no name, the k8scsr signer hands the CSR as it is to the external signer, " +
			"and the Pod's SPIFFE ID would only ride in the " + k8scsr.AnnotationSPIFFEID + " annotation, which anyone who may create a CertificateSigningRequest can set",
	})
}

// k8scsrFlags configure the CertificateSigningRequest backend.
type k8scsrFlags struct {
	signerName string
	kubeconfig string
}

func (k *k8scsrFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&k.signerName, "k8scsr-signer-name", "", "k8scsr signer: spec.signerName of the CertificateSigningRequests meshca creates, e.g. example.com/meshca; a controller of yours approves and issues them")
	fl.StringVar(&k.kubeconfig, "k8scsr-kubeconfig", "", "k8scsr signer: kubeconfig of the cluster the CertificateSigningRequests go to; empty uses --kubeconfig (the local cluster)")
}

func (k *k8scsrFlags) validate(b *backendFlags) error {
	switch {
	case b.trustAnchors == "" && !b.hasState:
		return fmt.Errorf("%s (or a CA state) is required with the k8scsr signer: the trust bundle is pinned, never learned from the cluster", name("trust-anchors"))
	case k.signerName == "":
		return fmt.Errorf("%s is required with the k8scsr signer", name("k8scsr-signer-name"))
	}
	return b.requireServing("k8scsr")
}

func (k *k8scsrFlags) load(_ *backendFlags, c *serve.Backend, _ *slog.Logger) error {
	c.K8sCSR = &serve.K8sCSR{SignerName: k.signerName, Kubeconfig: k.kubeconfig}
	return nil
}
