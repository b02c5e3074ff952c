package vaultpki

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/self"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// chainOfCAs is a root and an intermediate under it (Vault's issuer),
// made by the self upstream, and a request for an intermediate under the
// root.
func chainOfCAs(t *testing.T) (root, issuer *x509.Certificate, req *upstream.Request) {
	t.Helper()
	s := self.New()
	ctx := context.Background()
	r, err := s.NewRoot(ctx, &upstream.RootRequest{KeyType: certs.KeyECP256, Subject: pkix.Name{CommonName: "root"}, TTL: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	request := func(root *x509.Certificate) *upstream.Request {
		key, err := certs.GenerateKey(certs.KeyECP256)
		if err != nil {
			t.Fatal(err)
		}
		csr, err := upstream.NewCSR(key, pkix.Name{CommonName: "inter"}, td)
		if err != nil {
			t.Fatal(err)
		}
		return &upstream.Request{CSR: csr, TrustDomain: td, Root: root, Ref: upstream.Ref{Type: Name, Key: "id"}, TTL: time.Hour}
	}
	ir := request(r.Cert)
	ir.RootKey, ir.Ref = r.Key, r.Ref
	is, err := s.SignIntermediate(ctx, ir)
	if err != nil {
		t.Fatal(err)
	}
	return r.Cert, is.Cert, request(r.Cert)
}

func answer(cert *x509.Certificate, chain ...*x509.Certificate) *api.Secret {
	var list []any
	for _, c := range chain {
		list = append(list, string(pemutil.EncodeCertificates(c)))
	}
	return &api.Secret{Data: map[string]any{"certificate": string(pemutil.EncodeCertificates(cert)), "ca_chain": list}}
}

// TestSigned: Chain is what lies between the intermediate and the root,
// whatever order of ca_chain; a root other than the one asked is refused
// as an issuer of another lineage; an answer without a certificate is
// internal.
func TestSigned(t *testing.T) {
	root, issuer, _ := chainOfCAs(t)
	stranger, _, _ := chainOfCAs(t)
	leafish := issuer // any certificate stands for the one Vault signed
	tests := []struct {
		name      string
		secret    *api.Secret
		wantChain int
		wantKind  upstream.Kind
		says      string
	}{
		{name: "Vault's ca_chain: itself, its issuer, the root", secret: answer(leafish, leafish, root), wantChain: 0},
		{name: "an issuer between", secret: answer(root, root, issuer, root), wantChain: 1},
		{name: "another lineage's root", secret: answer(leafish, leafish, stranger), wantKind: upstream.KindRefused, says: "another lineage"},
		{name: "no certificate", secret: &api.Secret{Data: map[string]any{}}, wantKind: upstream.KindInternal, says: "certificate"},
		{name: "a ca_chain entry that is not PEM", secret: &api.Secret{Data: map[string]any{"certificate": string(pemutil.EncodeCertificates(leafish)), "ca_chain": []any{7}}},
			wantKind: upstream.KindInternal, says: "ca_chain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := signed(tt.secret, "pki/issuer/id/sign-intermediate", root)
			if tt.wantKind != "" {
				if upstream.KindOf(err) != tt.wantKind || !strings.Contains(err.Error(), tt.says) {
					t.Fatalf("got %v, want kind %s saying %q", err, tt.wantKind, tt.says)
				}
				return
			}
			if err != nil || len(resp.Chain) != tt.wantChain {
				t.Fatalf("got %v (chain %d), want a chain of %d", err, len(resp.Chain), tt.wantChain)
			}
		})
	}
}

// TestCheckRequest: what Vault is never asked.
func TestCheckRequest(t *testing.T) {
	root, _, req := chainOfCAs(t)
	now := time.Now()
	with := func(edit func(r *upstream.Request)) *upstream.Request {
		r := *req
		edit(&r)
		return &r
	}
	tests := []struct {
		name string
		req  *upstream.Request
		kind upstream.Kind
		says string
	}{
		{"as asked", req, "", ""},
		{"another upstream's root", with(func(r *upstream.Request) { r.Ref = upstream.Ref{Type: "vault-transit", Key: "k:1"} }), upstream.KindRefused, "not by a Vault PKI issuer"},
		{"a path in the issuer", with(func(r *upstream.Request) { r.Ref.Key = "id/../../sys" }), upstream.KindRefused, "Vault PKI issuer"},
		{"outliving the root", with(func(r *upstream.Request) { r.TTL = root.NotAfter.Sub(now) + time.Hour }), upstream.KindRefused, "outlive its root"},
		{"no trust domain", with(func(r *upstream.Request) { r.TrustDomain = spiffeid.TrustDomain{} }), upstream.KindInternal, "trust domain"},
	}
	for _, tt := range tests {
		err := checkRequest(tt.req, now)
		switch {
		case tt.kind == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.kind != "" && (upstream.KindOf(err) != tt.kind || !strings.Contains(err.Error(), tt.says)):
			t.Errorf("%s: got %v, want kind %s saying %q", tt.name, err, tt.kind, tt.says)
		}
	}
}
