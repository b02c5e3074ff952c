package signer_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/signer"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TestCheckIssuedDNS: a DNS request's leaf holds exactly its DNS names,
// in any order, and nothing else; the other rules are a workload's.
func TestCheckIssuedDNS(t *testing.T) {
	ca := testca.NewRoot(t, "check root", testca.Options{})
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"istiod.istio-system.svc", "istiod-canary.istio-system.svc"}
	start := time.Now()
	tests := []struct {
		name string
		edit func(*x509.Certificate)
		want string
	}{
		{"exact names", nil, ""},
		{"names in another order", func(c *x509.Certificate) { c.DNSNames = []string{names[1], names[0]} }, ""},
		{"one name missing", func(c *x509.Certificate) { c.DNSNames = names[:1] }, "want exactly the DNS names " + strings.Join(names, ",")},
		{"another name besides", func(c *x509.Certificate) { c.DNSNames = append(c.DNSNames, "kubernetes.default.svc") }, `"kubernetes.default.svc"`},
		{"a name twice", func(c *x509.Certificate) { c.DNSNames = []string{names[0], names[0]} }, "want exactly the DNS names"},
		{"a SPIFFE ID besides", func(c *x509.Certificate) {
			c.URIs = []*url.URL{spiffeid.RequireFromString("spiffe://cluster.local/ns/istio-system/sa/istiod").URL()}
		}, "want exactly the DNS names"},
		{"a subject", func(c *x509.Certificate) { c.Subject = pkix.Name{CommonName: names[0]} }, "want an empty subject"},
		{"a CA", func(c *x509.Certificate) { c.IsCA = true }, "is a CA"},
		{"no client auth", func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} }, "lacks extended key usage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			usages := csr.WorkloadUsages(key.Public())
			tmpl := &x509.Certificate{
				SerialNumber: big.NewInt(7), NotBefore: start.Add(-time.Minute), NotAfter: start.Add(time.Hour),
				DNSNames: names, KeyUsage: usages.Key, ExtKeyUsage: usages.Ext, BasicConstraintsValid: true,
			}
			if tt.edit != nil {
				tt.edit(tmpl)
			}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
			if err != nil {
				t.Fatal(err)
			}
			leaf, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			req := &signer.Request{CSR: &x509.CertificateRequest{PublicKey: key.Public()}, DNSNames: names, TTL: time.Hour, Usages: usages}
			err = signer.CheckIssued("test", req, leaf, signer.Lifetime{Start: start})
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("CheckIssued: %v, want success", err)
			case tt.want == "":
			case signer.KindOf(err) != signer.KindRefused || !strings.Contains(err.Error(), tt.want):
				t.Fatalf("CheckIssued: %v, want a refusal containing %q", err, tt.want)
			}
		})
	}
}
