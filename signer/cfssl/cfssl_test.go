package cfssl_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cloudflare/cfssl/config"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/cfssl"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

func TestContractLocal(t *testing.T) {
	signertest.Run(t, signertest.Backend{
		New: func(t testing.TB, a *keymgr.Authority) signer.Signer {
			s, err := cfssl.NewLocal(cfssl.LocalConfig{CACert: a.Cert, CAKey: a.Key, Chain: a.Chain})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

// TestProfileWiderThanWorkloads: a profile that adds usages is refused,
// never silently issued.
func TestProfileWiderThanWorkloads(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	tests := []struct {
		usages []string
		want   string
	}{
		{[]string{"digital signature", "cert sign", "server auth", "client auth"}, "goes beyond the allowed"},
		{[]string{"digital signature", "server auth", "client auth", "code signing"}, "not allowed for workloads"},
		{[]string{"digital signature", "server auth"}, "lacks extended key usage"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.usages, ","), func(t *testing.T) {
			policy := &config.Signing{Default: &config.SigningProfile{Usage: tt.usages, Expiry: 24 * time.Hour, ExpiryString: "24h"}}
			s, err := cfssl.NewLocal(cfssl.LocalConfig{CACert: root.Cert, CAKey: root.Key, Policy: policy})
			if err != nil {
				t.Fatal(err)
			}
			id := spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")
			key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			p, _ := csr.Build(key, id)
			req, _ := csr.Parse(p)
			_, err = s.Sign(context.Background(), &signer.Request{CSR: req, ID: id, TTL: time.Hour, Usages: csr.WorkloadUsages(req.PublicKey)})
			var se *signer.Error
			if !errors.As(err, &se) || se.Kind != signer.KindRefused || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want refused with %q", err, tt.want)
			}
		})
	}
}
