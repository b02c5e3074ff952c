package signers

import (
	"context"
	"crypto/x509"
	"errors"
	"math/big"
	"slices"
	"testing"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/signer"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// listed reports whether serial is on one of crls, each signed by ca.
func listed(t *testing.T, crls [][]byte, ca *x509.Certificate, serial *big.Int) bool {
	t.Helper()
	found := false
	for _, der := range crls {
		l, err := x509.ParseRevocationList(der)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.CheckSignatureFrom(ca); err != nil {
			t.Fatalf("a CRL from Vault is not signed by its issuer: %v", err)
		}
		found = found || slices.ContainsFunc(l.RevokedCertificateEntries, func(e x509.RevocationListEntry) bool { return e.SerialNumber.Cmp(serial) == 0 })
	}
	return found
}

// TestVaultRevoke: against the real Vault, a leaf meshca's roles issued
// (no_store) is revoked by its certificate and then listed on the CRL
// Vault signs; by serial alone Vault cannot find it, and says so; a
// certificate Vault never issued is refused.
func TestVaultRevoke(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	root := testca.NewRoot(t, "root", testca.Options{})
	s, _, _ := newVaultSigner(t, v, root.Authority(), harness.VaultRole{}, harness.VaultRootToken)
	rv, err := signer.RevokerOf(s, "vault")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")
	res, err := s.Sign(ctx, vaultRequest(t, id))
	if err != nil {
		t.Fatal(err)
	}
	crls, err := rv.CRLs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(crls) != 1 || listed(t, crls, root.Cert, res.Leaf.SerialNumber) {
		t.Fatalf("%d CRLs before the revocation, want one that does not list the leaf", len(crls))
	}
	err = rv.Revoke(ctx, signer.Revocation{Serial: res.Leaf.SerialNumber})
	wantKind(t, err, signer.KindRefused, "no_store keeps no serials")
	if err := rv.Revoke(ctx, signer.Revocation{Serial: res.Leaf.SerialNumber, Cert: res.Leaf}); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	if err := rv.Revoke(ctx, signer.Revocation{Cert: res.Leaf}); err != nil {
		t.Fatalf("Revoke again: %v", err)
	}
	if crls, err = rv.CRLs(ctx); err != nil {
		t.Fatal(err)
	}
	if !listed(t, crls, root.Cert, res.Leaf.SerialNumber) {
		t.Fatal("the revoked leaf is not on Vault's CRL")
	}
	stranger := testca.NewRoot(t, "stranger", testca.Options{}).Leaf(t, id.String(), nil)
	err = rv.Revoke(ctx, signer.Revocation{Cert: stranger})
	var se *signer.Error
	if !errors.As(err, &se) || se.Kind != signer.KindRefused {
		t.Fatalf("revoking a certificate Vault never issued: err = %v, want a refusal", err)
	}
}
