package serve_test

import (
	"context"
	"errors"
	"testing"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/internal/testca"
)

// TestAssemblePodCertificateRefusals: a pod certificate signer the
// assembly cannot run names the setting at fault and says why.
func TestAssemblePodCertificateRefusals(t *testing.T) {
	issuer := testca.NewRoot(t, "external signer's root", testca.Options{})
	k8scsr := func(c *serve.Config) {
		c.Backend = externalServing(t, issuer, servingDir(t, issuer)).Backend
		c.Backend.External = &external{name: "k8scsr", issuer: issuer, pods: errors.New("the kubelet's stub CSR carries no name")}
	}
	tests := []struct {
		name   string
		mutate func(*serve.Config)
		field  string
		msg    string
	}{
		{name: "k8scsr signer", mutate: k8scsr, field: "pod-certificate-signer-name",
			msg: "serve: pod-certificate-signer-name: cannot be used with the k8scsr signer (--signer k8scsr): the kubelet's stub CSR carries no name"},
		{name: "k8scsr signer, the bundle's signer name given", mutate: func(c *serve.Config) {
			k8scsr(c)
			c.Trust.ClusterTrustBundle, c.Trust.ClusterTrustBundleSigner = true, "meshca.io/svid"
		}, field: "pod-certificate-signer-name", msg: "serve: pod-certificate-signer-name: cannot be used with the k8scsr signer (--signer k8scsr): "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config(t)
			c.PodCertificates = serve.PodCertificates{SignerName: "meshca.io/svid"}
			c.Trust.LeaseNamespace = "istio-system"
			tt.mutate(&c)
			_, err := serve.Assemble(context.Background(), c)
			var fe *serve.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field || len(err.Error()) < len(tt.msg) || err.Error()[:len(tt.msg)] != tt.msg {
				t.Fatalf("err = %v, want a FieldError for %q starting %q", err, tt.field, tt.msg)
			}
		})
	}
}
