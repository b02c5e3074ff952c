package main

import (
	"fmt"

	"github.com/meshca/meshca/ca/serve"
	"github.com/spf13/pflag"
)

// k8scsrFlags configure the CertificateSigningRequest backend.
type k8scsrFlags struct {
	signerName string
	kubeconfig string
}

func (k *k8scsrFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&k.signerName, "k8scsr-signer-name", "", "k8scsr signer: spec.signerName of the CertificateSigningRequests meshca creates, e.g. example.com/meshca; a controller of yours approves and issues them")
	fl.StringVar(&k.kubeconfig, "k8scsr-kubeconfig", "", "k8scsr signer: kubeconfig of the cluster the CertificateSigningRequests go to; empty uses --kubeconfig (the local cluster)")
}

func (b *backendFlags) validateK8sCSR() error {
	switch {
	case b.trustAnchors == "" && !b.hasState:
		return fmt.Errorf("%s (or a CA state) is required with the k8scsr signer: the trust bundle is pinned, never learned from the cluster", name("trust-anchors"))
	case b.k8scsr.signerName == "":
		return fmt.Errorf("%s is required with the k8scsr signer", name("k8scsr-signer-name"))
	case b.servingCert == "" || b.servingKey == "":
		return fmt.Errorf("%s and %s are required with the k8scsr signer: meshca holds no CA key to issue its own", name("serving-cert-file"), name("serving-key-file"))
	}
	return nil
}

func (k *k8scsrFlags) config() *serve.K8sCSR {
	return &serve.K8sCSR{SignerName: k.signerName, Kubeconfig: k.kubeconfig}
}
