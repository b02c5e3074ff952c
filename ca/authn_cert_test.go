package ca

import (
	"context"
	"crypto/x509"
	"math/big"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
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

// revokedSet is a RevokedCerts of issuer/serial keys; an empty issuer
// matches any.
type revokedSet map[string]bool

func (r revokedSet) Revoked(serial *big.Int, issuer string) bool {
	return r["/"+serial.Text(16)] || r[issuer+"/"+serial.Text(16)]
}

// TestCertAuthenticatorRevoked: a certificate revoked in the CA state
// (meshca revoke) renews nothing, nor does a leaf under a revoked
// intermediate, or revoking it would be undone by the next renewal; the
// same serial revoked under another issuer does not count, and a leaf
// beside it renews.
func TestCertAuthenticatorRevoked(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	root := testca.NewRoot(t, "root", testca.Options{})
	inter, other := root.NewIntermediate(t, "inter", testca.Options{}), root.NewIntermediate(t, "other", testca.Options{})
	bundles := x509bundle.FromX509Authorities(td, []*x509.Certificate{root.Cert})
	leaf, fine := leafUnder(t, inter, nil), leafUnder(t, inter, nil)
	key := func(issuer *x509.Certificate, c *x509.Certificate) string {
		return keymgr.Fingerprint(issuer) + "/" + c.SerialNumber.Text(16)
	}
	tests := []struct {
		name    string
		chain   []*x509.Certificate
		revoked revokedSet
		code    codes.Code
		reason  string
	}{
		{"revoked leaf", []*x509.Certificate{leaf, inter.Cert}, revokedSet{key(inter.Cert, leaf): true}, codes.Unauthenticated, "cert_revoked"},
		{"revoked leaf, issuer not recorded", []*x509.Certificate{leaf, inter.Cert}, revokedSet{"/" + leaf.SerialNumber.Text(16): true}, codes.Unauthenticated, "cert_revoked"},
		{"revoked intermediate", []*x509.Certificate{leaf, inter.Cert}, revokedSet{key(root.Cert, inter.Cert): true}, codes.Unauthenticated, "cert_revoked"},
		{"its serial revoked by another CA", []*x509.Certificate{leaf, inter.Cert}, revokedSet{key(other.Cert, leaf): true}, codes.OK, "ok"},
		{"another leaf of the same CA", []*x509.Certificate{fine, inter.Cert}, revokedSet{key(inter.Cert, leaf): true}, codes.OK, "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &CertAuthenticator{TrustDomain: td, Bundles: bundles, Revoked: tt.revoked}
			_, err := a.Authenticate(context.Background(), &Credentials{PeerCerts: tt.chain})
			o := classify(err)
			if o.Code != tt.code || o.Reason != tt.reason {
				t.Fatalf("code %v, reason %s (%v); want %v, %s", o.Code, o.Reason, err, tt.code, tt.reason)
			}
			if err != nil && o.Msg != "client certificate is revoked: authenticate with a service-account token" {
				t.Errorf("message %q", o.Msg)
			}
		})
	}
}
