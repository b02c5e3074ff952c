package signers

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/cfssl"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// authKey is a throwaway HMAC key (hex), as cfssl's "standard" provider takes.
const authKey = "0123456789abcdef0123456789abcdef"

func TestCfsslRemoteContract(t *testing.T) {
	for _, key := range []string{"", authKey} {
		name := "sign"
		if key != "" {
			name = "authsign"
		}
		t.Run(name, func(t *testing.T) {
			signertest.Run(t, signertest.Backend{
				FixedLifetime: 24 * time.Hour,
				DNS:           true,
				New: func(tb testing.TB, a *keymgr.Authority) signer.Signer {
					srv := harness.StartCfssl(tb, cfsslBin, a, harness.CfsslOptions{AuthKey: key})
					s, err := cfssl.NewRemote(cfssl.RemoteConfig{URL: srv.URL, AuthKey: key, KeyEnciphermentProfile: harness.CfsslRSAProfile,
						DNSProfile: harness.CfsslIstiodProfile, Chain: a.Chain})
					if err != nil {
						tb.Fatal(err)
					}
					return harness.LintedSigner(tb, a, s)
				},
			})
		})
	}
}

// TestCfsslRemoteRefusals: what a real cfssl server refuses, and what
// meshca refuses of what it issued, with the kind and the reason.
func TestCfsslRemoteRefusals(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	a := root.Authority()
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	request := func(key crypto.Signer, subject pkix.Name) *signer.Request {
		san, _ := csr.MarshalURISAN(id.String())
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: subject, ExtraExtensions: []pkix.Extension{san}}, key)
		if err != nil {
			t.Fatal(err)
		}
		parsed, err := csr.Parse(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
		if err != nil {
			t.Fatal(err)
		}
		return &signer.Request{CSR: parsed, ID: id, TTL: time.Hour, Usages: csr.WorkloadUsages(parsed.PublicKey)}
	}
	ecReq, rsaReq := request(ecKey, pkix.Name{}), request(rsaKey, pkix.Name{})
	withSubject := request(ecKey, pkix.Name{Organization: []string{"system:masters"}})
	plain := harness.StartCfssl(t, cfsslBin, a, harness.CfsslOptions{})
	authSrv := harness.StartCfssl(t, cfsslBin, a, harness.CfsslOptions{AuthKey: authKey})
	long := harness.StartCfssl(t, cfsslBin, a, harness.CfsslOptions{Expiry: "2160h"})
	wide := harness.StartCfssl(t, cfsslBin, a, harness.CfsslOptions{Usages: []string{"digital signature", "cert sign", "server auth", "client auth"}})
	copies := harness.StartCfssl(t, cfsslBin, a, harness.CfsslOptions{CopySubject: true})
	tests := []struct {
		name string
		cfg  cfssl.RemoteConfig
		req  *signer.Request // ecReq when nil
		kind signer.Kind
		want string
	}{
		{"wrong auth key", cfssl.RemoteConfig{URL: authSrv.URL, AuthKey: "fedcba9876543210fedcba9876543210", Issuer: root.Cert}, nil, signer.KindRefused, "invalid token"},
		{"no auth key", cfssl.RemoteConfig{URL: authSrv.URL, Issuer: root.Cert}, nil, signer.KindRefused, ""},
		{"profile adds cert sign", cfssl.RemoteConfig{URL: wide.URL}, nil, signer.KindRefused, "goes beyond the allowed"},
		{"profile longer than requested", cfssl.RemoteConfig{URL: long.URL}, nil, signer.KindRefused, "set the profile's expiry"},
		{"RSA key without an RSA profile", cfssl.RemoteConfig{URL: plain.URL}, rsaReq, signer.KindRefused, `lacks key usage ["key encipherment"]`},
		{"EC key sent to the RSA profile", cfssl.RemoteConfig{URL: plain.URL, Profile: harness.CfsslRSAProfile}, nil, signer.KindRefused, "goes beyond the allowed"},
		{"unknown RSA profile", cfssl.RemoteConfig{URL: plain.URL, KeyEnciphermentProfile: "rsa4096"}, rsaReq, signer.KindRefused, "lacks key usage"},
		{"profile without the CSR whitelist", cfssl.RemoteConfig{URL: copies.URL}, withSubject, signer.KindRefused, `add "CSRWhitelist"`},
		{"server down", cfssl.RemoteConfig{URL: "http://127.0.0.1:1", Issuer: root.Cert}, nil, signer.KindUnavailable, "connection refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := cfssl.NewRemote(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			req := tt.req
			if req == nil {
				req = ecReq
			}
			_, err = s.Sign(context.Background(), req)
			var se *signer.Error
			if !errors.As(err, &se) || se.Kind != tt.kind || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want kind %s containing %q", err, tt.kind, tt.want)
			}
		})
	}
}
