package upstreams

import (
	"context"
	"crypto/x509"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/upstream/vaultpki"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TestVaultPKICRL: with the root in Vault PKI, the CRL keeper stores
// Vault's CRL of the root beside meshca's own of the intermediate; an
// intermediate revoked in the CA state is revoked in Vault, whose next
// CRL lists it; each CRL verifies with its CA.
func TestVaultPKICRL(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	v.MountPKI(t, "pki-crl")
	admin := newPKI(t, v, "pki-crl", rootToken(t))
	ren := &keymgr.Renewer{Upstream: admin, Name: vaultpki.Name, TrustDomain: spiffeid.RequireTrustDomainFromString("crl.example"), TTL: time.Hour, KeyType: certs.KeyECP256}
	ctx := context.Background()
	store := &dirstore.Store{Dir: filepath.Join(t.TempDir(), "state")}
	now := time.Now()
	st, err := keymgr.LoadOrBootstrap(ctx, store, func() (*keymgr.AuthorityRecord, error) {
		return ren.NewAuthority(ctx, keymgr.RootOptions{Organization: "crl.example", TTL: 24 * time.Hour, KeyType: certs.KeyECP256})
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	a := st.Active()
	// serve's policy with the CRL's, as docs/upstream.md gives them.
	_, serveFile := v.PolicyToken(t, "meshca-pki-crl", docPolicy(t, "meshca-pki", "pki/", "pki-crl/", "ISSUER_ID", a.Upstream.Key)+
		docPolicy(t, "meshca-pki-crl", "pki/", "pki-crl/"))
	u := newPKI(t, v, "pki-crl", serveFile)
	k := &keymgr.CRLKeeper{Store: store, Source: u, UpstreamName: vaultpki.Name}
	lists := func(issuer string, serial *x509.Certificate) bool {
		t.Helper()
		s, _, err := store.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rec, ok := s.View().CRL(issuer)
		if !ok {
			t.Fatalf("no CRL of %.16s", issuer)
		}
		l, err := x509.ParseRevocationList(rec.DER)
		if err != nil {
			t.Fatal(err)
		}
		ca := a.Cert
		if issuer == a.RootID() {
			ca = a.Root
		}
		if err := l.CheckSignatureFrom(ca); err != nil {
			t.Fatalf("the CRL of %.16s is not signed by it: %v", issuer, err)
		}
		return slices.ContainsFunc(l.RevokedCertificateEntries, func(e x509.RevocationListEntry) bool { return e.SerialNumber.Cmp(serial.SerialNumber) == 0 })
	}
	if issued, err := k.Tick(ctx); err != nil || len(issued) != 2 {
		t.Fatalf("first look: %d CRLs, %v; want the intermediate's and Vault's root's", len(issued), err)
	}
	if lists(a.RootID(), a.Cert) || lists(a.ID(), a.Cert) {
		t.Fatal("a CRL lists the intermediate before it is revoked")
	}
	if _, err := keymgr.Update(ctx, store, func(s *keymgr.State) error {
		_, err := s.Revoke([]keymgr.Revocation{{Serial: a.Cert.SerialNumber, Issuer: a.RootID(), Reason: 1, RevokedAt: now, NotAfter: a.Cert.NotAfter, By: "test"}}, now)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	issued, err := k.Tick(ctx)
	if err != nil || len(issued) != 1 || issued[0].Issuer != a.RootID() {
		t.Fatalf("after the revocation: %+v, %v; want Vault's CRL of the root", issued, err)
	}
	if !lists(a.RootID(), a.Cert) {
		t.Fatal("Vault's CRL of the root does not list the intermediate revoked")
	}
}
