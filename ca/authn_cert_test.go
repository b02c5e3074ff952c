package ca

import (
	"context"
	"crypto/x509"
	"testing"

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
		{"live intermediate", []*x509.Certificate{leafUnder(t, live, nil), live.Cert}, retiredSet{old.Cert}, codes.OK, "ok"},
		{"retired intermediate", []*x509.Certificate{leafUnder(t, old, nil), old.Cert}, retiredSet{old.Cert}, codes.Unauthenticated, "cert_retired_issuer"},
		{"retired root-signing authority", []*x509.Certificate{leafUnder(t, root, nil)}, retiredSet{root.Cert}, codes.Unauthenticated, "cert_retired_issuer"},
		{"no retired list", []*x509.Certificate{leafUnder(t, old, nil), old.Cert}, nil, codes.OK, "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &CertAuthenticator{TrustDomain: td, Bundles: bundles, Retired: tt.retired}
			caller, err := a.Authenticate(context.Background(), &Credentials{PeerCerts: tt.chain})
			o := classify(err)
			if o.Code != tt.code || o.Reason != tt.reason {
				t.Fatalf("code %v, reason %s (%v); want %v, %s", o.Code, o.Reason, err, tt.code, tt.reason)
			}
			if err == nil && caller.ID != issuedID {
				t.Fatalf("caller %+v", caller)
			}
		})
	}
}
