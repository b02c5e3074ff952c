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
	"time"

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

// TestSignAnswerLimits: a leaf Vault issued for longer than the requested
// TTL is refused with the role setting to change, and so is an answer
// without its issuing CA, as nothing would then hold the leaf to its
// issuer's expiry.
func TestSignAnswerLimits(t *testing.T) {
	tests := []struct {
		name string
		ttl  time.Duration
		edit func(data map[string]any)
		kind signer.Kind // "": issued
		want []string
	}{
		{name: "the lifetime the role issues", ttl: time.Hour},
		{name: "a shorter TTL than the role issues", ttl: 5 * time.Minute, kind: signer.KindRefused,
			want: []string{"past the requested lifetime", "role pki/roles/mesh must leave the lifetime to the ttl meshca sends: unset its not_after"}},
		{name: "ca_chain without issuing_ca", ttl: time.Hour, edit: func(d map[string]any) {
			d["ca_chain"] = []string{d["issuing_ca"].(string)}
			delete(d, "issuing_ca")
		}},
		{name: "no issuing CA", ttl: time.Hour, edit: func(d map[string]any) { delete(d, "issuing_ca") }, kind: signer.KindInternal,
			want: []string{"answer from pki/sign/mesh holds no issuing CA (issuing_ca or ca_chain)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVault(t, func(string) bool { return false })
			f.edit = tt.edit
			s := f.newSigner(t, vault.Config{})
			req := newRequest(t, workload)
			req.TTL = tt.ttl
			res, err := s.Sign(context.Background(), req)
			if tt.kind == "" {
				if err != nil {
					t.Fatalf("Sign: %v", err)
				}
				if !res.Leaf.NotAfter.Before(f.ca.NotAfter) {
					t.Errorf("leaf until %v outlives its issuer (%v)", res.Leaf.NotAfter, f.ca.NotAfter)
				}
				return
			}
			if signer.KindOf(err) != tt.kind || res != nil {
				t.Fatalf("Sign = %v, %v; want a %s failure", res, err, tt.kind)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want it to say %q", err, w)
				}
			}
		})
	}
}
