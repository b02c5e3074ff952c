package keymgr_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/storetest"
	"github.com/meshca/meshca/keymgr/upstream"
)

// fakeSource keeps the CRL of one CA as Vault PKI does: its own
// revocations, a number that grows with each rebuild.
type fakeSource struct {
	mu      sync.Mutex
	cert    *x509.Certificate
	key     crypto.Signer
	revoked []*big.Int
	number  int64
	revokes int
}

func (f *fakeSource) CRL(_ context.Context, issuer *x509.Certificate, _ upstream.Ref) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !issuer.Equal(f.cert) {
		return nil, &upstream.Error{Upstream: "vault-pki", Kind: upstream.KindRefused, Err: errors.New("no such issuer")}
	}
	f.number++
	tmpl := &x509.RevocationList{Number: big.NewInt(f.number), ThisUpdate: time.Now().Add(-time.Minute), NextUpdate: time.Now().Add(72 * time.Hour)}
	for _, s := range f.revoked {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: time.Now()})
	}
	return x509.CreateRevocationList(rand.Reader, tmpl, f.cert, f.key)
}

func (f *fakeSource) Revoke(_ context.Context, cert *x509.Certificate, _ upstream.Ref) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cert.CheckSignatureFrom(f.cert) != nil {
		return &upstream.Error{Upstream: "vault-pki", Kind: upstream.KindRefused, Err: errors.New("not signed by an issuer of the mount")}
	}
	f.revokes++
	f.revoked = append(f.revoked, cert.SerialNumber)
	return nil
}

// TestCRLKeeperSource: the CRL of a root whose key and CRL Vault PKI
// keeps is Vault's; an intermediate revoked in the state is revoked in
// Vault first, then its CRL stored once it lists it; a serial the state
// holds no certificate of is an error saying to revoke it there.
func TestCRLKeeperSource(t *testing.T) {
	now := time.Now()
	rec := storetest.NewRenewedRecords(t, now, upstream.Ref{Type: "self"}, keymgr.PhasePrevious, keymgr.PhaseActive)
	src := &fakeSource{cert: rec[0].Root, key: rec[0].RootKey}
	for _, r := range rec {
		r.RootKey, r.Upstream = nil, upstream.Ref{Type: "vault-pki", Key: "issuer-1"}
	}
	store := &codecStore{}
	if _, err := store.Save(t.Context(), &keymgr.State{Sequence: 1, Authorities: rec}, ""); err != nil {
		t.Fatal(err)
	}
	k := &keymgr.CRLKeeper{Store: store, Source: src, UpstreamName: "vault-pki", Now: func() time.Time { return now }}
	if got := crlTick(t, k); len(got) != 3 {
		t.Fatalf("issued %d CRLs, want the two intermediates' and Vault's root's", len(got))
	}
	checkCRLs(t, load(t, store), now)
	if got := crlTick(t, k); len(got) != 0 {
		t.Fatalf("a second look stored %d CRLs", len(got))
	}
	old := rec[0].Cert
	if _, err := keymgr.Update(t.Context(), store, func(s *keymgr.State) error {
		_, err := s.Revoke([]keymgr.Revocation{{Serial: old.SerialNumber, Issuer: rec[0].RootID(), Reason: 4, RevokedAt: now, NotAfter: old.NotAfter}}, now)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	got := crlTick(t, k)
	if len(got) != 1 || got[0].Issuer != rec[0].RootID() || src.revokes != 1 {
		t.Fatalf("issued %+v with %d revocations in Vault; want the root's CRL after one", got, src.revokes)
	}
	s := load(t, store)
	c, _ := s.View().CRL(rec[0].RootID())
	l, err := x509.ParseRevocationList(c.DER)
	if err != nil || len(l.RevokedCertificateEntries) != 1 || l.RevokedCertificateEntries[0].SerialNumber.Cmp(old.SerialNumber) != 0 {
		t.Fatalf("the stored CRL does not list the intermediate revoked: %v", err)
	}
	if got := crlTick(t, k); len(got) != 0 || src.revokes != 1 {
		t.Fatalf("a look after stored %d and revoked %d times in Vault", len(got), src.revokes)
	}
	if _, err := keymgr.Update(t.Context(), store, func(s *keymgr.State) error {
		_, err := s.Revoke([]keymgr.Revocation{{Serial: big.NewInt(77), Issuer: rec[0].RootID(), RevokedAt: now, NotAfter: now.Add(time.Hour)}}, now)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_, err = k.Tick(t.Context())
	var ce *keymgr.CRLError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "serial 4D is revoked in the CA state but not on upstream vault-pki's CRL") {
		t.Fatalf("err = %v, want a CRLError saying to revoke it in Vault", err)
	}
}
