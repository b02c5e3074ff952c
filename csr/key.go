package csr

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"fmt"
	"slices"
	"strings"
)

// KeyPolicy says which public keys a workload certificate may carry.
// The zero value allows nothing; use DefaultKeyPolicy.
type KeyPolicy struct {
	// ECDSACurves lists the allowed curves by name ("P-256", "P-384", "P-521").
	ECDSACurves []string
	// Ed25519 allows Ed25519 keys.
	Ed25519 bool
	// RSAMinBits and RSAMaxBits bound RSA modulus sizes; RSAMinBits == 0
	// disallows RSA.
	RSAMinBits, RSAMaxBits int
}

// DefaultKeyPolicy allows ECDSA P-256 and P-384, Ed25519, and RSA from 2048
// to 8192 bits.
func DefaultKeyPolicy() KeyPolicy {
	return KeyPolicy{
		ECDSACurves: []string{"P-256", "P-384"},
		Ed25519:     true,
		RSAMinBits:  2048,
		RSAMaxBits:  8192,
	}
}

// ParseKeyPolicy reads a policy written as a comma-separated list of
// "ecdsa-p256", "ecdsa-p384", "ecdsa-p521", "ed25519" and "rsa-MIN-MAX"
// (for example "ecdsa-p256,rsa-2048-4096").
func ParseKeyPolicy(s string) (KeyPolicy, error) {
	var p KeyPolicy
	for _, item := range strings.Split(s, ",") {
		item = strings.ToLower(strings.TrimSpace(item))
		switch {
		case item == "":
		case item == "ecdsa-p256":
			p.ECDSACurves = append(p.ECDSACurves, "P-256")
		case item == "ecdsa-p384":
			p.ECDSACurves = append(p.ECDSACurves, "P-384")
		case item == "ecdsa-p521":
			p.ECDSACurves = append(p.ECDSACurves, "P-521")
		case item == "ed25519":
			p.Ed25519 = true
		case strings.HasPrefix(item, "rsa-"):
			var lo, hi int
			// Sscanf stops at the second number: the round trip refuses anything
			// after it ("rsa-2048-4096;ed25519"), signs and leading zeros.
			if _, err := fmt.Sscanf(item, "rsa-%d-%d", &lo, &hi); err != nil || item != fmt.Sprintf("rsa-%d-%d", lo, hi) || lo < 2048 || hi < lo || hi > 16384 {
				return KeyPolicy{}, fmt.Errorf("csr: key policy %q: want rsa-MIN-MAX with 2048 <= MIN <= MAX <= 16384", item)
			}
			p.RSAMinBits, p.RSAMaxBits = lo, hi
		default:
			return KeyPolicy{}, fmt.Errorf("csr: unknown key policy item %q (want ecdsa-p256, ecdsa-p384, ecdsa-p521, ed25519 or rsa-MIN-MAX)", item)
		}
	}
	if len(p.ECDSACurves) == 0 && !p.Ed25519 && p.RSAMinBits == 0 {
		return KeyPolicy{}, fmt.Errorf("csr: key policy %q allows no key at all", s)
	}
	return p, nil
}

// Check reports whether pub is allowed.
func (p KeyPolicy) Check(pub any) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		name := curveName(k.Curve)
		if !slices.Contains(p.ECDSACurves, name) {
			return errorf(ReasonKey, "ECDSA curve %s is not allowed (allowed: %s)", name, p.allowed())
		}
	case ed25519.PublicKey:
		if !p.Ed25519 {
			return errorf(ReasonKey, "Ed25519 keys are not allowed (allowed: %s)", p.allowed())
		}
	case *rsa.PublicKey:
		bits := k.N.BitLen()
		if p.RSAMinBits == 0 || bits < p.RSAMinBits || bits > p.RSAMaxBits {
			return errorf(ReasonKey, "RSA key of %d bits is not allowed (allowed: %s)", bits, p.allowed())
		}
	case nil:
		// x509 leaves the key nil for an algorithm it does not know (Ed448,
		// say).
		return errorf(ReasonKey, "the key's algorithm is not supported (allowed: %s)", p.allowed())
	default:
		return errorf(ReasonKey, "key type %T is not allowed (allowed: %s)", pub, p.allowed())
	}
	return nil
}

func (p KeyPolicy) allowed() string {
	var parts []string
	for _, c := range p.ECDSACurves {
		parts = append(parts, "ECDSA "+c)
	}
	if p.Ed25519 {
		parts = append(parts, "Ed25519")
	}
	if p.RSAMinBits > 0 {
		parts = append(parts, fmt.Sprintf("RSA %d-%d", p.RSAMinBits, p.RSAMaxBits))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func curveName(c elliptic.Curve) string {
	if c == nil || c.Params() == nil {
		return "unknown"
	}
	return c.Params().Name
}

// SamePublicKey reports whether a and b are the same public key.
func SamePublicKey(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}
