// Package pemutil encodes and decodes the PEM forms of certificates and
// private keys that meshca reads and writes.
package pemutil

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// Block types.
const (
	TypeCertificate = "CERTIFICATE"
	TypePrivateKey  = "PRIVATE KEY"
	typeECKey       = "EC PRIVATE KEY"
	typeRSAKey      = "RSA PRIVATE KEY"
)

// ErrNoPEM is returned when the input holds no PEM block at all.
var ErrNoPEM = errors.New("no PEM data")

// ParseCertificates returns every certificate in data, in order. It refuses
// blocks of any other type and trailing non-PEM data.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != TypeCertificate {
			return nil, fmt.Errorf("PEM block %d is %q, want %q", len(certs)+1, block.Type, TypeCertificate)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("data that is not PEM follows the certificates")
	}
	if len(certs) == 0 {
		return nil, ErrNoPEM
	}
	return certs, nil
}

// EncodeCertificates returns the concatenated PEM of certs.
func EncodeCertificates(certs ...*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&buf, &pem.Block{Type: TypeCertificate, Bytes: c.Raw})
	}
	return buf.Bytes()
}

// ParsePrivateKey decodes one PEM private key in PKCS#8, SEC 1 (EC) or
// PKCS#1 (RSA) form.
func ParsePrivateKey(data []byte) (crypto.Signer, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, ErrNoPEM
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("more than one PEM block")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case TypePrivateKey:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case typeECKey:
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case typeRSAKey:
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("PEM block is %q, want a private key", block.Type)
	}
	if err != nil {
		return nil, err
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey, *rsa.PrivateKey, ed25519.PrivateKey:
		return k.(crypto.Signer), nil
	default:
		return nil, fmt.Errorf("unsupported private key type %T", key)
	}
}

// EncodePrivateKey returns key as PKCS#8 PEM.
func EncodePrivateKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: TypePrivateKey, Bytes: der}), nil
}
