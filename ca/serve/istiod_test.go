package serve_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/internal/testca"
)

// TestAssembleIstiodCertRefusals: a keeper of istiod's certificate the
// assembly cannot run names the setting at fault and says why.
func TestAssembleIstiodCertRefusals(t *testing.T) {
	issuer := testca.NewRoot(t, "external signer's root", testca.Options{})
	tests := []struct {
		name   string
		mutate func(*serve.Config)
		field  string
		msg    string
	}{
		{name: "a backend that cannot", mutate: func(c *serve.Config) {
			c.Backend = externalServing(t, issuer, servingDir(t, issuer)).Backend
			c.Backend.External = &external{name: "vault", issuer: issuer,
				istiod: &serve.FieldError{Field: "vault-istiod-role", Err: errors.New("needs a Vault role of its own")}}
		}, field: "vault-istiod-role", msg: "needs a Vault role of its own"},
		{name: "not namespace/name", mutate: func(c *serve.Config) { c.IstiodCert.Secret = "istiod-tls" },
			field: "istiod-cert-secret", msg: `"istiod-tls": want namespace/name`},
		{name: "no names", mutate: func(c *serve.Config) { c.IstiodCert.DNSNames = nil },
			field: "istiod-cert-dns-names", msg: "at least one DNS name"},
		{name: "no Lease namespace", mutate: func(c *serve.Config) { c.Trust.LeaseNamespace = "" },
			field: "trust-lease-namespace", msg: "needs the namespace of its Lease"},
		{name: "the CA state's Secret", mutate: func(c *serve.Config) {
			c.Backend = serve.Backend{StateSecret: "istio-system/meshca-ca-state"}
			c.IstiodCert.Secret = "istio-system/meshca-ca-state"
		}, field: "istiod-cert-secret", msg: `"istio-system/meshca-ca-state" is the CA state's Secret (--state-secret), which holds the CA's keys`},
		{name: "Istio's cacerts", mutate: func(c *serve.Config) { c.IstiodCert.Secret = "istio-system/cacerts" },
			field: "istiod-cert-secret", msg: `"istio-system/cacerts" is Istio's CA Secret cacerts, which holds a CA's private key`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config(t)
			c.IstiodCert = serve.IstiodCert{Secret: "istio-system/istiod-tls", DNSNames: []string{"istiod.istio-system.svc"}}
			c.Trust.LeaseNamespace = "istio-system"
			tt.mutate(&c)
			_, err := serve.Assemble(context.Background(), c)
			var fe *serve.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v, want a FieldError for %q saying %q", err, tt.field, tt.msg)
			}
		})
	}
}
