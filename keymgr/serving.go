package keymgr

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"time"
)

// ServingOptions describe the TLS certificate meshca serves its API with.
type ServingOptions struct {
	// Names become DNS SANs, or IP SANs when they parse as IP addresses.
	Names []string
	TTL   time.Duration
	Now   time.Time
}

// DefaultServingTTL is the lifetime of a serving certificate.
const DefaultServingTTL = 30 * 24 * time.Hour

// IssueServing signs a fresh ECDSA P-256 serving certificate with a. Clients
// verify it against the trust bundle they are given, like any workload peer.
func IssueServing(a *Authority, o ServingOptions) (*tls.Certificate, error) {
	if len(o.Names) == 0 {
		return nil, errors.New("keymgr: serving certificate needs at least one DNS name or IP")
	}
	if o.TTL <= 0 {
		o.TTL = DefaultServingTTL
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	key, err := GenerateKey(KeyECP256)
	if err != nil {
		return nil, err
	}
	serial, err := NewSerial()
	if err != nil {
		return nil, err
	}
	skid, err := SubjectKeyID(key.Public())
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: o.Names[0]},
		NotBefore:             o.Now.Add(-Backdate),
		NotAfter:              capTime(o.Now.Add(o.TTL), a.NotAfter()),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		SubjectKeyId:          skid,
	}
	for _, n := range o.Names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, key.Public(), a.Key)
	if err != nil {
		return nil, fmt.Errorf("keymgr: sign serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("keymgr: parse serving certificate: %w", err)
	}
	chain := [][]byte{der}
	for _, c := range a.Intermediates() {
		chain = append(chain, c.Raw)
	}
	return &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, nil
}

func capTime(t, limit time.Time) time.Time {
	if t.After(limit) {
		return limit
	}
	return t
}
