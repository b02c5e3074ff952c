package keymgr

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
	"time"
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

// RootOptions describe a self-signed root.
type RootOptions struct {
	KeyType KeyType
	// Organization goes into the subject, as Istio does with the trust domain.
	Organization string
	TTL          time.Duration
	Now          time.Time
}

// DefaultRootTTL is the lifetime of a generated root (Istio's is 10 years).
const DefaultRootTTL = 10 * 365 * 24 * time.Hour

// NewRoot generates a key and a self-signed root CA certificate and returns
// them as an Authority whose only root is itself.
func NewRoot(o RootOptions) (*Authority, error) {
	if o.TTL <= 0 {
		o.TTL = DefaultRootTTL
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	key, serial, skid, err := newKeySerialID(o.KeyType)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{o.Organization},
			CommonName:   "meshca root " + o.Now.UTC().Format("2006-01-02T15:04:05Z"),
		},
		NotBefore:             o.Now.Add(-Backdate),
		NotAfter:              o.Now.Add(o.TTL),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          skid,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("keymgr: create root: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("keymgr: parse root: %w", err)
	}
	return &Authority{Cert: cert, Key: key, Roots: []*x509.Certificate{cert}}, nil
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

// newKeySerialID returns a fresh key of type t, a serial number and the key
// identifier of the key: what every certificate meshca makes starts with.
func newKeySerialID(t KeyType) (crypto.Signer, *big.Int, []byte, error) {
	key, err := GenerateKey(t)
	if err != nil {
		return nil, nil, nil, err
	}
	serial, err := NewSerial()
	if err != nil {
		return nil, nil, nil, err
	}
	skid, err := SubjectKeyID(key.Public())
	if err != nil {
		return nil, nil, nil, err
	}
	return key, serial, skid, nil
}
