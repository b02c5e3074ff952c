package signers

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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
				New: func(tb testing.TB, a *keymgr.Authority) signer.Signer {
					srv := harness.StartCfssl(tb, cfsslBin, a, harness.CfsslOptions{AuthKey: key})
					s, err := cfssl.NewRemote(cfssl.RemoteConfig{URL: srv.URL, AuthKey: key, Chain: a.Chain})
					if err != nil {
						tb.Fatal(err)
					}
					return s
				},
			})
		})
	}
}

func TestCfsslRemoteRefusals(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	a := root.Authority()
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p, _ := csr.Build(key, id)
	parsed, _ := csr.Parse(p)
	req := &signer.Request{CSR: parsed, ID: id, TTL: time.Hour, Usages: csr.WorkloadUsages(parsed.PublicKey)}
	authSrv := harness.StartCfssl(t, cfsslBin, a, harness.CfsslOptions{AuthKey: authKey})
	long := harness.StartCfssl(t, cfsslBin, a, harness.CfsslOptions{Expiry: "2160h"})
	wide := harness.StartCfssl(t, cfsslBin, a, harness.CfsslOptions{Usages: []string{"digital signature", "cert sign", "server auth", "client auth"}})
	tests := []struct {
		name string
		cfg  cfssl.RemoteConfig
		kind signer.Kind
		want string
	}{
		{"wrong auth key", cfssl.RemoteConfig{URL: authSrv.URL, AuthKey: "fedcba9876543210fedcba9876543210", Issuer: root.Cert}, signer.KindRefused, "invalid token"},
		{"no auth key", cfssl.RemoteConfig{URL: authSrv.URL, Issuer: root.Cert}, signer.KindRefused, ""},
		{"profile adds cert sign", cfssl.RemoteConfig{URL: wide.URL}, signer.KindRefused, "goes beyond the allowed"},
		{"profile longer than requested", cfssl.RemoteConfig{URL: long.URL}, signer.KindRefused, "set the profile's expiry"},
		{"server down", cfssl.RemoteConfig{URL: "http://127.0.0.1:1", Issuer: root.Cert}, signer.KindUnavailable, "connection refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := cfssl.NewRemote(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Sign(context.Background(), req)
			var se *signer.Error
			if !errors.As(err, &se) || se.Kind != tt.kind || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want kind %s containing %q", err, tt.kind, tt.want)
			}
		})
	}
}
