package csr_test

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"math/big"
	"reflect"
	"strings"
	"testing"

	"github.com/meshca/meshca/csr"
)

func TestParseKeyPolicy(t *testing.T) {
	tests := []struct {
		spec string
		want csr.KeyPolicy
		err  string // a fragment of the error; empty: no error
	}{
		{spec: "ecdsa-p256", want: csr.KeyPolicy{ECDSACurves: []string{"P-256"}}},
		{spec: "ecdsa-p256,ecdsa-p384,ecdsa-p521", want: csr.KeyPolicy{ECDSACurves: []string{"P-256", "P-384", "P-521"}}},
		{spec: "ed25519", want: csr.KeyPolicy{Ed25519: true}},
		{spec: "rsa-2048-4096", want: csr.KeyPolicy{RSAMinBits: 2048, RSAMaxBits: 4096}},
		{spec: "rsa-3072-3072", want: csr.KeyPolicy{RSAMinBits: 3072, RSAMaxBits: 3072}},
		{spec: "rsa-2048-16384", want: csr.KeyPolicy{RSAMinBits: 2048, RSAMaxBits: 16384}},
		{spec: "ecdsa-p256,rsa-2048-4096", want: csr.KeyPolicy{ECDSACurves: []string{"P-256"}, RSAMinBits: 2048, RSAMaxBits: 4096}},
		{spec: "ecdsa-p256,ecdsa-p384,ed25519,rsa-2048-8192", want: csr.DefaultKeyPolicy()},
		{spec: " ECDSA-P384 , Ed25519 ", want: csr.KeyPolicy{ECDSACurves: []string{"P-384"}, Ed25519: true}},
		{spec: "ecdsa-p256,,ed25519,", want: csr.KeyPolicy{ECDSACurves: []string{"P-256"}, Ed25519: true}},
		{spec: "rsa-2048-4096,rsa-3072-8192", want: csr.KeyPolicy{RSAMinBits: 3072, RSAMaxBits: 8192}},

		{spec: "", err: "allows no key at all"},
		{spec: " , ", err: "allows no key at all"},
		{spec: "ecdsa", err: `unknown key policy item "ecdsa"`},
		{spec: "ecdsa-p224", err: `unknown key policy item "ecdsa-p224"`},
		{spec: "p256", err: `unknown key policy item "p256"`},
		{spec: "ecdsa-p256;ed25519", err: `unknown key policy item "ecdsa-p256;ed25519"`},
		{spec: "ed448", err: `unknown key policy item "ed448"`},
		{spec: "ecdsa-p256,x25519", err: `unknown key policy item "x25519"`},
		{spec: "rsa", err: `unknown key policy item "rsa"`},
		{spec: "rsa-", err: "want rsa-MIN-MAX"},
		{spec: "rsa-2048", err: "want rsa-MIN-MAX"},
		{spec: "rsa-2048-", err: "want rsa-MIN-MAX"},
		{spec: "rsa-a-b", err: "want rsa-MIN-MAX"},
		{spec: "rsa-1024-4096", err: "want rsa-MIN-MAX"},
		{spec: "rsa-4096-2048", err: "want rsa-MIN-MAX"},
		{spec: "rsa-2048-32768", err: "want rsa-MIN-MAX"},
		{spec: "rsa--2048-4096", err: "want rsa-MIN-MAX"},
		{spec: "rsa-2048-4096x", err: "want rsa-MIN-MAX"},
		{spec: "rsa-2048-4096-8192", err: "want rsa-MIN-MAX"},
		{spec: "rsa-2048-4096;ed25519", err: "want rsa-MIN-MAX"},
		{spec: "rsa-+2048-4096", err: "want rsa-MIN-MAX"},
		{spec: "rsa-02048-4096", err: "want rsa-MIN-MAX"},
		{spec: "rsa- 2048-4096", err: "want rsa-MIN-MAX"},
		{spec: "rsa-2048-4096,bogus", err: `unknown key policy item "bogus"`},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := csr.ParseKeyPolicy(tt.spec)
			if tt.err != "" {
				if err == nil {
					t.Fatalf("ParseKeyPolicy(%q) = %+v, want an error containing %q", tt.spec, got, tt.err)
				}
				if !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseKeyPolicy(%q) error = %q, want it to contain %q", tt.spec, err, tt.err)
				}
				if !reflect.DeepEqual(got, csr.KeyPolicy{}) {
					t.Fatalf("ParseKeyPolicy(%q) returned %+v along with an error", tt.spec, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseKeyPolicy(%q): %v", tt.spec, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseKeyPolicy(%q) = %+v, want %+v", tt.spec, got, tt.want)
			}
		})
	}
}

// rsaPublicKey returns an RSA public key with a modulus of the given size.
// KeyPolicy.Check looks only at the size, so there is no need to generate
// a real key.
func rsaPublicKey(bits int) *rsa.PublicKey {
	n := new(big.Int).Lsh(big.NewInt(1), uint(bits-1))
	n.SetBit(n, 0, 1)
	return &rsa.PublicKey{N: n, E: 65537}
}

func TestKeyPolicyCheck(t *testing.T) {
	x25519, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaOnly, err := csr.ParseKeyPolicy("rsa-3072-4096")
	if err != nil {
		t.Fatal(err)
	}
	p384Only, err := csr.ParseKeyPolicy("ecdsa-p384")
	if err != nil {
		t.Fatal(err)
	}
	pub := func(f func() crypto.Signer) crypto.PublicKey { return f().Public() }
	def := csr.DefaultKeyPolicy()

	tests := []struct {
		name   string
		policy csr.KeyPolicy
		pub    any
		detail string // empty: allowed
	}{
		{"default P-256", def, pub(p256Key), ""},
		{"default P-384", def, pub(p384Key), ""},
		{"default P-521", def, pub(p521Key), "ECDSA curve P-521 is not allowed (allowed: ECDSA P-256, ECDSA P-384, Ed25519, RSA 2048-8192)"},
		{"default P-224", def, pub(p224Key), "ECDSA curve P-224 is not allowed"},
		{"default ECDSA without curve", def, &ecdsa.PublicKey{}, "ECDSA curve unknown is not allowed"},
		{"default Ed25519", def, pub(ed25519Key), ""},
		{"default RSA-1024", def, rsaPublicKey(1024), "RSA key of 1024 bits is not allowed"},
		{"default RSA-2047", def, rsaPublicKey(2047), "RSA key of 2047 bits"},
		{"default RSA-2048", def, rsaPublicKey(2048), ""},
		{"default RSA-8192", def, rsaPublicKey(8192), ""},
		{"default RSA-8193", def, rsaPublicKey(8193), "RSA key of 8193 bits"},
		{"default RSA-16384", def, rsaPublicKey(16384), "RSA key of 16384 bits"},
		{"default X25519", def, x25519.PublicKey(), "key type *ecdh.PublicKey is not allowed"},
		{"default nil", def, nil, "the key's algorithm is not supported"},
		{"default private key", def, p256Key(), "key type *ecdsa.PrivateKey is not allowed"},
		{"RSA only, RSA-3072", rsaOnly, rsaPublicKey(3072), ""},
		{"RSA only, RSA-2048", rsaOnly, rsaPublicKey(2048), "(allowed: RSA 3072-4096)"},
		{"RSA only, RSA-8192", rsaOnly, rsaPublicKey(8192), "RSA key of 8192 bits"},
		{"RSA only, P-256", rsaOnly, pub(p256Key), "ECDSA curve P-256 is not allowed (allowed: RSA 3072-4096)"},
		{"RSA only, Ed25519", rsaOnly, pub(ed25519Key), "Ed25519 keys are not allowed (allowed: RSA 3072-4096)"},
		{"P-384 only, P-384", p384Only, pub(p384Key), ""},
		{"P-384 only, P-256", p384Only, pub(p256Key), "(allowed: ECDSA P-384)"},
		{"P-384 only, RSA-2048", p384Only, rsaPublicKey(2048), "RSA key of 2048 bits is not allowed (allowed: ECDSA P-384)"},
		{"zero policy, P-256", csr.KeyPolicy{}, pub(p256Key), "(allowed: none)"},
		{"zero policy, Ed25519", csr.KeyPolicy{}, pub(ed25519Key), "(allowed: none)"},
		{"zero policy, RSA-2048", csr.KeyPolicy{}, rsaPublicKey(2048), "(allowed: none)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.policy.Check(tt.pub)
			if tt.detail == "" {
				requireReason(t, err, "", "")
				return
			}
			requireReason(t, err, csr.ReasonKey, tt.detail)
		})
	}
}

// TestDefaultKeyPolicy checks that DefaultKeyPolicy returns a fresh value
// each time, so that a caller changing its copy changes no other.
func TestDefaultKeyPolicy(t *testing.T) {
	p := csr.DefaultKeyPolicy()
	p.ECDSACurves[0] = "P-521"
	if got := csr.DefaultKeyPolicy().ECDSACurves[0]; got != "P-256" {
		t.Fatalf("DefaultKeyPolicy().ECDSACurves[0] = %q after a caller changed its copy", got)
	}
	if got := csr.DefaultPolicy().Keys; !reflect.DeepEqual(got, csr.DefaultKeyPolicy()) {
		t.Fatalf("DefaultPolicy().Keys = %+v, want DefaultKeyPolicy()", got)
	}
}
