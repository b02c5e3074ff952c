package local_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/local"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

func TestContract(t *testing.T) {
	signertest.Run(t, signertest.Backend{
		DNS: true,
		New: func(t testing.TB, ca *keymgr.Authority) signer.Signer {
			return local.New(local.Config{Authorities: keymgr.NewManager(spiffeid.RequireTrustDomainFromString("cluster.local"), ca)})
		},
	})
}

func TestBackdate(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	root := testca.NewRoot(t, "backdate root", testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)})
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	req := signertest.NewRequest(t, spiffeid.RequireFromString("spiffe://cluster.local/ns/default/sa/web"), key, time.Minute)
	tests := []struct {
		backdate, want time.Duration
	}{
		{0, certs.Backdate},
		{time.Second, time.Second},
		{certs.NoBackdate, 0},
	}
	for _, tt := range tests {
		s := local.New(local.Config{Authorities: keymgr.NewManager(req.ID.TrustDomain(), root.Authority()), Backdate: tt.backdate,
			Now: func() time.Time { return now }})
		resp, err := s.Sign(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if got := now.Sub(resp.Leaf.NotBefore); got != tt.want {
			t.Errorf("Backdate %v: the leaf starts %v before now, want %v", tt.backdate, got, tt.want)
		}
	}
}
