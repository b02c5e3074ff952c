package keymgr

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
)

// RootOptions describe a self-signed root.
type RootOptions struct {
	KeyType certs.KeyType
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
		NotBefore:             o.Now.Add(-certs.Backdate),
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

// newKeySerialID returns a fresh key of type t, a serial number and the key
// identifier of the key: what every certificate meshca makes starts with.
func newKeySerialID(t certs.KeyType) (crypto.Signer, *big.Int, []byte, error) {
	key, err := certs.GenerateKey(t)
	if err != nil {
		return nil, nil, nil, err
	}
	serial, err := certs.NewSerial()
	if err != nil {
		return nil, nil, nil, err
	}
	skid, err := certs.SubjectKeyID(key.Public())
	if err != nil {
		return nil, nil, nil, err
	}
	return key, serial, skid, nil
}
