package csr

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Build returns the PEM request ztunnel sends for id: an empty subject and
// exactly one extension, a critical subjectAltName holding the URI of id.
// The signature algorithm follows the key (ECDSA P-256 keys sign with
// SHA-256).
func Build(key crypto.Signer, id spiffeid.ID) ([]byte, error) {
	san, err := MarshalURISAN(id.String())
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		ExtraExtensions: []pkix.Extension{san},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("csr: build request: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: der}), nil
}

// BuildDNS returns the PEM request meshca makes for a DNS serving
// certificate (istiod's): an empty subject and one critical
// subjectAltName holding names as DNS names, in order.
func BuildDNS(key crypto.Signer, names []string) ([]byte, error) {
	sans := make([]asn1.RawValue, len(names))
	for i, n := range names {
		sans[i] = asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: tagDNS, Bytes: []byte(n)}
	}
	der, err := asn1.Marshal(sans)
	if err != nil {
		return nil, fmt.Errorf("csr: marshal subjectAltName: %w", err)
	}
	der, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		ExtraExtensions: []pkix.Extension{{Id: oidSAN, Critical: true, Value: der}},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("csr: build request: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: der}), nil
}

// MarshalURISAN returns a critical subjectAltName extension holding the
// given URIs, in order.
func MarshalURISAN(uris ...string) (pkix.Extension, error) {
	names := make([]asn1.RawValue, len(uris))
	for i, u := range uris {
		names[i] = asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: tagURI, Bytes: []byte(u)}
	}
	der, err := asn1.Marshal(names)
	if err != nil {
		return pkix.Extension{}, fmt.Errorf("csr: marshal subjectAltName: %w", err)
	}
	return pkix.Extension{Id: oidSAN, Critical: true, Value: der}, nil
}
