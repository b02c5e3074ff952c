package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/signer/k8scsr"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const signerK8sCSR = "k8scsr"

func init() {
	registerSigner(&signerBackend{
		name: signerK8sCSR, usage: "k8scsr (Kubernetes CertificateSigningRequests)",
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
	c.External = &k8scsrExternal{signerName: k.signerName, kubeconfig: k.kubeconfig}
	return nil
}

// k8scsrExternal is the CertificateSigningRequest backend as serve opens
// it: requests named signerName in the cluster of kubeconfig (empty: the
// local cluster's).
type k8scsrExternal struct {
	signerName, kubeconfig string
}

func (k *k8scsrExternal) Name() string { return signerK8sCSR }

// Open builds the signer, and a probe of its apiserver (its version).
func (k *k8scsrExternal) Open(_ context.Context, env serve.ExternalEnv) (*serve.Opened, error) {
	fail := func(err error) error { return &serve.FieldError{Field: "k8scsr-signer-name", Err: err} }
	cfg, err := clientcmd.BuildConfigFromFlags("", cmp.Or(k.kubeconfig, env.LocalKubeconfig))
	if err != nil {
		return nil, fail(fmt.Errorf("kubernetes client configuration: %w", err))
	}
	cfg.QPS, cfg.Burst = 100, 200
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fail(err)
	}
	s, err := k8scsr.New(k8scsr.Config{Client: client, SignerName: k.signerName, Roots: env.Roots,
		OnDeleteError: func(err error) { env.Log.Warn("CertificateSigningRequest left behind", logError, err) }})
	if err != nil {
		return nil, fail(err)
	}
	probe := func(ctx context.Context) error {
		_, err := client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
		return err
	}
	return &serve.Opened{Signer: s, Remote: true, Probe: probe}, nil
}

// IstiodCert refuses: see the message.
func (k *k8scsrExternal) IstiodCert() error {
	return &serve.FieldError{Field: "istiod-cert-secret", Err: errors.New("cannot be used with the k8scsr signer: a CertificateSigningRequest's " +
		"signer decides what it certifies and cannot tell istiod's DNS request from a workload's; sign with the " +
		signerNames(func(b *signerBackend) bool { return b.name != signerK8sCSR }) + " signer")}
}

// PodCertificates refuses: the descriptor's noPodCertificates says why.
func (k *k8scsrExternal) PodCertificates() error {
	return errors.New(signerNamed(signerK8sCSR).noPodCertificates + "; sign pod certificates with the " +
		signerNames(func(b *signerBackend) bool { return b.noPodCertificates == "" }) + " signer")
}
