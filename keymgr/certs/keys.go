package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"math/big"
)

// KeyType names a CA key algorithm.
type KeyType string

// CA key types.
const (
	KeyECP256  KeyType = "ec-p256"
	KeyECP384  KeyType = "ec-p384"
	KeyRSA2048 KeyType = "rsa-2048"
	KeyRSA3072 KeyType = "rsa-3072"
	KeyRSA4096 KeyType = "rsa-4096"
)

// KeyTypes lists the supported key types, default first.
var KeyTypes = []KeyType{KeyECP256, KeyECP384, KeyRSA2048, KeyRSA3072, KeyRSA4096}

// GenerateKey returns a new private key of type t.
func GenerateKey(t KeyType) (crypto.Signer, error) {
	switch t {
	case KeyECP256, "":
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case KeyECP384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case KeyRSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	case KeyRSA3072:
		return rsa.GenerateKey(rand.Reader, 3072)
	case KeyRSA4096:
		return rsa.GenerateKey(rand.Reader, 4096)
	}
	return nil, fmt.Errorf("keymgr: unknown key type %q (want one of %v)", t, KeyTypes)
}

var serialLimit = new(big.Int).Lsh(big.NewInt(1), 128)

// NewSerial returns a random positive serial number of up to 128 bits.
func NewSerial() (*big.Int, error) {
	for {
		n, err := rand.Int(rand.Reader, serialLimit)
		if err != nil {
			return nil, fmt.Errorf("keymgr: serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

// SubjectKeyID returns the RFC 5280 method 1 key identifier of pub: the
// SHA-1 of the subjectPublicKey bit string.
func SubjectKeyID(pub crypto.PublicKey) ([]byte, error) {
	// An EC key's subjectPublicKey is its uncompressed point: no ASN.1
	// round trip, which cost a workload leaf more than its SHA-1.
	if k, ok := pub.(*ecdsa.PublicKey); ok {
		if point, err := k.Bytes(); err == nil {
			sum := sha1.Sum(point)
			return sum[:], nil
		}
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("keymgr: marshal public key: %w", err)
	}
	var spki struct {
		Algorithm pkix.AlgorithmIdentifier
		PublicKey asn1.BitString
	}
	if _, err := asn1.Unmarshal(der, &spki); err != nil {
		return nil, fmt.Errorf("keymgr: parse public key: %w", err)
	}
	sum := sha1.Sum(spki.PublicKey.Bytes)
	return sum[:], nil
}
