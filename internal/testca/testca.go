// Package testca builds throwaway certificate authorities for tests.
package testca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
)

// CA is a certificate and key that can sign further CAs.
type CA struct {
	Cert   *x509.Certificate
	Key    crypto.Signer
	parent *CA
}

// Options tweak a generated CA. Zero values give a P-256 CA valid from an
// hour ago for a year.
type Options struct {
	NotBefore, NotAfter time.Time
	Key                 crypto.Signer
	// NotCA issues a certificate without basicConstraints CA:true.
	NotCA bool
}

// NewRoot returns a self-signed root.
func NewRoot(tb testing.TB, name string, o Options) *CA {
	tb.Helper()
	return issue(tb, nil, name, o)
}

// NewIntermediate returns a CA signed by ca.
func (ca *CA) NewIntermediate(tb testing.TB, name string, o Options) *CA {
	tb.Helper()
	return issue(tb, ca, name, o)
}

// Root returns the root at the top of ca's chain.
func (ca *CA) Root() *CA {
	for ca.parent != nil {
		ca = ca.parent
	}
	return ca
}

// Authority returns ca as a keymgr.Authority trusting the roots given, or
// its own root when none are.
func (ca *CA) Authority(roots ...*x509.Certificate) *keymgr.Authority {
	var chain []*x509.Certificate
	for p := ca.parent; p != nil && p.parent != nil; p = p.parent {
		chain = append(chain, p.Cert)
	}
	if len(roots) == 0 {
		roots = []*x509.Certificate{ca.Root().Cert}
	}
	return &keymgr.Authority{Cert: ca.Cert, Key: ca.Key, Chain: chain, Roots: roots}
}

var serial atomic.Int64

func issue(tb testing.TB, parent *CA, name string, o Options) *CA {
	tb.Helper()
	now := time.Now()
	if o.NotBefore.IsZero() {
		o.NotBefore = now.Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = now.Add(365 * 24 * time.Hour)
	}
	if o.Key == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			tb.Fatal(err)
		}
		o.Key = k
	}
	skid, err := certs.SubjectKeyID(o.Key.Public())
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1000 + serial.Add(1)),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"meshca test"}},
		NotBefore:             o.NotBefore,
		NotAfter:              o.NotAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  !o.NotCA,
		SubjectKeyId:          skid,
	}
	signerCert, signerKey := tmpl, o.Key
	if parent != nil {
		signerCert, signerKey = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signerCert, o.Key.Public(), signerKey)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return &CA{Cert: cert, Key: o.Key, parent: parent}
}

// Leaf issues, under ca, a workload leaf for the URI id (a SPIFFE ID, or
// anything a test needs refused) with a new P-256 key: valid from a minute
// ago for an hour, digitalSignature, serverAuth and clientAuth, not a CA.
// mutate, when set, changes the template first.
func (ca *CA) Leaf(tb testing.TB, id string, mutate func(*x509.Certificate)) *x509.Certificate {
	tb.Helper()
	u, err := url.Parse(id)
	if err != nil {
		tb.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1000 + serial.Add(1)), NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		URIs: []*url.URL{u}, KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	if mutate != nil {
		mutate(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		tb.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return leaf
}
