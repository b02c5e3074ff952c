package ca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"

	"github.com/meshca/meshca/internal/testca"
)

type retiredSet []*x509.Certificate

func (r retiredSet) RetiredIssuer(c *x509.Certificate) bool {
	for _, x := range r {
		if x.Equal(c) {
			return true
		}
	}
	return false
}

// svidUnder issues a workload SVID for spiffe://cluster.local/ns/prod/sa/web
// signed by issuer.
func svidUnder(t *testing.T, issuer *testca.CA) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("spiffe://cluster.local/ns/prod/sa/web")
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		URIs:         []*url.URL{u},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer.Cert, key.Public(), issuer.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// TestCertAuthenticatorRetiredIssuer: a leaf of an intermediate retired
// under a root that stays trusted still chains to the bundle; it renews
// nothing, while a leaf of the live intermediate beside it does.
func TestCertAuthenticatorRetiredIssuer(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	root := testca.NewRoot(t, "root", testca.Options{})
	old, live := root.NewIntermediate(t, "old", testca.Options{}), root.NewIntermediate(t, "live", testca.Options{})
	bundles := x509bundle.FromX509Authorities(td, []*x509.Certificate{root.Cert})
	tests := []struct {
		name    string
		chain   []*x509.Certificate
		retired RetiredIssuers
		code    codes.Code
		reason  string
	}{
		{"live intermediate", []*x509.Certificate{svidUnder(t, live), live.Cert}, retiredSet{old.Cert}, codes.OK, "ok"},
		{"retired intermediate", []*x509.Certificate{svidUnder(t, old), old.Cert}, retiredSet{old.Cert}, codes.Unauthenticated, "cert_retired_issuer"},
		{"retired root-signing authority", []*x509.Certificate{svidUnder(t, root)}, retiredSet{root.Cert}, codes.Unauthenticated, "cert_retired_issuer"},
		{"no retired list", []*x509.Certificate{svidUnder(t, old), old.Cert}, nil, codes.OK, "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &CertAuthenticator{TrustDomain: td, Bundles: bundles, Retired: tt.retired}
			caller, err := a.Authenticate(context.Background(), &Credentials{PeerCerts: tt.chain})
			o := classify(err)
			if o.Code != tt.code || o.Reason != tt.reason {
				t.Fatalf("code %v, reason %s (%v); want %v, %s", o.Code, o.Reason, err, tt.code, tt.reason)
			}
			if err == nil && caller.ServiceAccount != "web" {
				t.Fatalf("caller %+v", caller)
			}
		})
	}
}
