//go:build pkcs11

package pkcs11

// The certificates meshca builds and the token signs. Every key-custody
// upstream (self, pkcs11, vault-transit) builds the same two; this file
// is the seam where the shared builder of keymgr/upstream takes over.

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
)

// buildIntermediate makes the intermediate req asks for, signed by
// rootKey: a CA for leaves only (path length 0), the CSR's key and URI
// SANs, from certs.Backdate before now (not before the root) to TTL after
// now. It refuses one that would outlive the root rather than shorten it.
func buildIntermediate(req *upstream.Request, rootKey crypto.Signer, now time.Time) (*x509.Certificate, error) {
	if err := req.CSR.CheckSignature(); err != nil {
		return nil, fmt.Errorf("the intermediate's CSR: %w", err)
	}
	notBefore, notAfter := now.Add(-certs.Backdate).Truncate(time.Second), now.Add(req.TTL).Truncate(time.Second)
	if notBefore.Before(req.Root.NotBefore) {
		notBefore = req.Root.NotBefore
	}
	if notAfter.After(req.Root.NotAfter) {
		return nil, fmt.Errorf("an intermediate of %v would end at %s, after its root (%s)", req.TTL, notAfter.UTC().Format(time.RFC3339), req.Root.NotAfter.UTC().Format(time.RFC3339))
	}
	serial, err := certs.NewSerial()
	if err != nil {
		return nil, err
	}
	skid, err := certs.SubjectKeyID(req.CSR.PublicKey)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               req.Subject,
		URIs:                  req.CSR.URIs,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		SubjectKeyId:          skid,
	}
	return create(tmpl, req.Root, req.CSR.PublicKey, rootKey)
}

// buildRoot makes the self-signed root req asks for over key.
func buildRoot(req *upstream.RootRequest, key crypto.Signer) (*x509.Certificate, error) {
	serial, err := certs.NewSerial()
	if err != nil {
		return nil, err
	}
	skid, err := certs.SubjectKeyID(key.Public())
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               req.Subject,
		NotBefore:             req.Now.Add(-certs.Backdate).Truncate(time.Second),
		NotAfter:              req.Now.Add(req.TTL).Truncate(time.Second),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          skid,
	}
	return create(tmpl, tmpl, key.Public(), key)
}

func create(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) (*x509.Certificate, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}
