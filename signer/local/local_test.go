package local_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
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

// TestRefusesEndingPath: an intermediate that expired, or ends sooner
// than a certificate worth issuing, signs nothing: the request is
// refused as unavailable, with the path's end and why it was not
// renewed; a path that still has enough left caps the leaf at its end.
func TestRefusesEndingPath(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	root := testca.NewRoot(t, "ending root", testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)})
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/default/sa/web")
	renewal := func() (string, error) { return "upstream self: unavailable since 10:00", errors.New("sealed") }
	tests := []struct {
		name   string
		left   time.Duration
		ttl    time.Duration
		refuse bool
	}{
		{"expired", -time.Minute, 24 * time.Hour, true},
		{"59s left of a day's leaf", 59 * time.Second, 24 * time.Hour, true},
		{"a minute left of a day's leaf", time.Minute, 24 * time.Hour, false},
		{"4s left of a 10s leaf", 4 * time.Second, 10 * time.Second, true},
		{"5s left of a 10s leaf", 5 * time.Second, 10 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inter := root.NewIntermediate(t, "ending intermediate", testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(tt.left)})
			s := local.New(local.Config{Authorities: keymgr.NewManager(id.TrustDomain(), inter.Authority()), Renewal: renewal,
				Now: func() time.Time { return now }})
			resp, err := s.Sign(context.Background(), signertest.NewRequest(t, id, key, tt.ttl))
			var ee *signer.ExpiringError
			switch {
			case !tt.refuse && err != nil:
				t.Fatal(err)
			case !tt.refuse && !resp.Leaf.NotAfter.Equal(inter.Cert.NotAfter):
				t.Fatalf("the leaf ends at %v, want its intermediate's end %v", resp.Leaf.NotAfter, inter.Cert.NotAfter)
			case !tt.refuse:
			case signer.KindOf(err) != signer.KindUnavailable || !errors.As(err, &ee):
				t.Fatalf("err = %v, want an unavailable backend's ExpiringError", err)
			case !ee.End.Equal(inter.Cert.NotAfter) || ee.Why == "" || !errors.Is(err, ee.Err):
				t.Fatalf("ExpiringError %+v: want the path's end and why", ee)
			}
		})
	}
}
