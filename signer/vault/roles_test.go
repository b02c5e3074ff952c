package vault_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/vault"
)

// TestKeyEnciphermentRole: RSA keys are signed by KeyEnciphermentRole,
// every other key by Role; without an RSA role, Role signs RSA keys too
// and the certificate, lacking key encipherment, is refused with the
// setting to change.
func TestKeyEnciphermentRole(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		role, rsa string
		key       crypto.Signer
		wantRole  string
		wantKU    x509.KeyUsage
		wantErr   []string // fragments of a refusal; none: issued
	}{
		{name: "RSA key, RSA role", role: "mesh", rsa: "mesh-rsa", key: rsaKey, wantRole: "mesh-rsa",
			wantKU: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment},
		{name: "EC key, RSA role", role: "mesh", rsa: "mesh-rsa", key: ecKey, wantRole: "mesh", wantKU: x509.KeyUsageDigitalSignature},
		{name: "Ed25519 key, RSA role", role: "mesh", rsa: "mesh-rsa", key: edKey, wantRole: "mesh", wantKU: x509.KeyUsageDigitalSignature},
		{name: "EC key, no RSA role", role: "mesh", key: ecKey, wantRole: "mesh", wantKU: x509.KeyUsageDigitalSignature},
		{name: "RSA key, no RSA role", role: "mesh", key: rsaKey, wantRole: "mesh",
			wantErr: []string{`lacks key usage ["key encipherment"]`, "pki/roles/mesh signs every key type", "key_usage=DigitalSignature,KeyEncipherment", "--vault-rsa-role"}},
		{name: "RSA role without key encipherment", role: "mesh", rsa: "mesh", key: rsaKey, wantRole: "mesh",
			wantErr: []string{"lacks key usage", "set key_usage=DigitalSignature,KeyEncipherment on role pki/roles/mesh"}},
		{name: "main role with key encipherment, EC key", role: "mesh-rsa", key: ecKey, wantRole: "mesh-rsa",
			wantErr: []string{"goes beyond the allowed", "set key_usage=DigitalSignature on role pki/roles/mesh-rsa", "--vault-rsa-role"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVault(t, func(string) bool { return false })
			s := f.newSigner(t, vault.Config{Role: tt.role, KeyEnciphermentRole: tt.rsa})
			res, err := s.Sign(context.Background(), newRequestFor(t, workload, tt.key))
			if got := f.roles(); !slices.Equal(got, []string{tt.wantRole}) {
				t.Errorf("signed by roles %v, want %s", got, tt.wantRole)
			}
			if len(tt.wantErr) > 0 {
				var se *signer.Error
				if !errors.As(err, &se) || se.Kind != signer.KindRefused {
					t.Fatalf("err = %v, want a refusal", err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("err = %v, want it to say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Leaf.KeyUsage != tt.wantKU {
				t.Errorf("key usage %v, want %v", res.Leaf.KeyUsage, tt.wantKU)
			}
		})
	}
}
