package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/signer/cfssl"
	"github.com/meshca/meshca/signer/vault"
	"github.com/prometheus/client_golang/prometheus"
)

// quietHealth hears of a backend's health and forgets it.
type quietHealth struct{}

func (quietHealth) Worked()      {}
func (quietHealth) Failed(error) {}
func (quietHealth) Reason(error) {}

// TestExternalRefusals: what each external backend says, to the
// assembly, it cannot sign as configured: istiod's certificate without a
// role or profile of its own, anything of istiod's or pods' with k8scsr.
func TestExternalRefusals(t *testing.T) {
	k8s := &k8scsrExternal{signerName: "example.com/meshca"}
	tests := []struct {
		name         string
		ext          serve.External
		istiodField  string // empty: it can
		istiod, pods string // the messages' beginnings; empty: none
	}{
		{name: "vault without a role for istiod", ext: &vaultExternal{c: vault.Config{Role: "mesh"}},
			istiodField: "vault-istiod-role", istiod: "istiod's certificate (--istiod-cert-secret) needs a Vault role of its own"},
		{name: "vault with one", ext: &vaultExternal{c: vault.Config{Role: "mesh", DNSRole: "istiod"}}},
		{name: "remote cfssl without a profile for istiod", ext: &cfsslExternal{remote: &cfssl.RemoteConfig{URL: "http://127.0.0.1:1"}},
			istiodField: "cfssl-istiod-profile", istiod: "istiod's certificate (--istiod-cert-secret) needs a cfssl profile of its own"},
		{name: "cfssl in process without one", ext: &cfsslExternal{local: &cfssl.LocalConfig{}},
			istiodField: "cfssl-istiod-profile", istiod: "istiod's certificate (--istiod-cert-secret) needs a profile of the cfssl signing policy"},
		{name: "cfssl in process with one", ext: &cfsslExternal{local: &cfssl.LocalConfig{DNSProfile: cfssl.DefaultIstiodProfile}}},
		{name: "k8scsr", ext: k8s, istiodField: "istiod-cert-secret",
			istiod: "cannot be used with the k8scsr signer: a CertificateSigningRequest's signer decides what it certifies and cannot tell " +
				"istiod's DNS request from a workload's; sign with the " + signerNames(func(b *signerBackend) bool { return b.name != signerK8sCSR }) + " signer",
			pods: "the kubelet's stub CSR carries no name, the k8scsr signer hands the CSR as it is to the external signer, and the Pod's " +
				"SPIFFE ID would only ride in the meshca.io/spiffe-id annotation, which anyone who may create a CertificateSigningRequest can set; " +
				"sign pod certificates with the " + podSigners() + " signer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.ext.IstiodCert()
			var fe *serve.FieldError
			switch {
			case tt.istiodField == "" && err != nil:
				t.Fatalf("IstiodCert = %v, want nil", err)
			case tt.istiodField != "" && (!errors.As(err, &fe) || fe.Field != tt.istiodField || !strings.HasPrefix(fe.Err.Error(), tt.istiod)):
				t.Fatalf("IstiodCert = %v, want a FieldError for %q starting %q", err, tt.istiodField, tt.istiod)
			}
			err = tt.ext.PodCertificates()
			if (tt.pods == "") != (err == nil) || err != nil && err.Error() != tt.pods {
				t.Fatalf("PodCertificates = %v, want %q", err, tt.pods)
			}
		})
	}
}

// TestExternalOpenRefusals: a configuration the backend's library refuses
// names the flag at fault.
func TestExternalOpenRefusals(t *testing.T) {
	tests := []struct {
		name  string
		ext   serve.External
		field string
	}{
		{"vault without an address", &vaultExternal{}, "vault-addr"},
		{"remote cfssl with a bad URL", &cfsslExternal{remote: &cfssl.RemoteConfig{URL: "://"}}, "cfssl-url"},
		{"cfssl in process without a CA", &cfsslExternal{local: &cfssl.LocalConfig{}}, "cfssl-ca-cert"},
		{"k8scsr without a kubeconfig it can read", &k8scsrExternal{signerName: "example.com/meshca", kubeconfig: "/nonexistent/kubeconfig"},
			"k8scsr-signer-name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := serve.ExternalEnv{Registerer: prometheus.NewRegistry(), Health: quietHealth{}, Log: slog.New(slog.DiscardHandler)}
			_, err := tt.ext.Open(context.Background(), env)
			var fe *serve.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field {
				t.Fatalf("Open = %v, want a FieldError for %q", err, tt.field)
			}
		})
	}
}
