package signertest

import (
	"context"
	"crypto"
	"crypto/x509"
	"slices"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
)

// DNSNames are the names of the suite's DNS requests: istiod's, with a
// revision's.
var DNSNames = []string{"istiod.istio-system.svc", "istiod-canary.istio-system.svc"}

// NewDNSRequest is a DNS request for names and ttl whose CSR, made with
// key, is checked as meshca checks its own (csr.Policy.CheckDNS).
func NewDNSRequest(tb testing.TB, key crypto.Signer, names []string, ttl time.Duration) *signer.Request {
	tb.Helper()
	p, err := csr.BuildDNS(key, names)
	if err != nil {
		tb.Fatal(err)
	}
	cr, err := csr.Parse(p)
	if err != nil {
		tb.Fatal(err)
	}
	if err := csr.DefaultPolicy().CheckDNS(cr, names); err != nil {
		tb.Fatal(err)
	}
	return &signer.Request{CSR: cr, DNSNames: names, TTL: ttl, Usages: csr.WorkloadUsages(cr.PublicKey)}
}

// testDNS: a backend that issues DNS certificates gives exactly the names
// asked for, as DNS SANs in a critical extension under an empty subject,
// with the usages of the key, for the TTL asked, verifying to the bundle
// for server and client auth; one that does not refuses, as an operator's
// matter (KindRefused), never with another certificate.
func testDNS(t *testing.T, s signer.Signer, a *keymgr.Authority, issues bool, ttl time.Duration) {
	key := newKey(t, "p256")
	before := time.Now()
	res, err := s.Sign(context.Background(), NewDNSRequest(t, key, DNSNames, ttl))
	if !issues {
		if err == nil || signer.KindOf(err) != signer.KindRefused {
			t.Fatalf("Sign of a DNS request = %v, want a refusal (%s)", err, signer.KindRefused)
		}
		return
	}
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	leaf := res.Leaf
	got := slices.Sorted(slices.Values(leaf.DNSNames))
	switch {
	case !slices.Equal(got, slices.Sorted(slices.Values(DNSNames))):
		t.Fatalf("DNS SANs %v, want exactly %v", leaf.DNSNames, DNSNames)
	case len(leaf.URIs)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0:
		t.Fatalf("extra SANs: URI %v IP %v email %v", leaf.URIs, leaf.IPAddresses, leaf.EmailAddresses)
	case len(leaf.RawSubject) != 2:
		t.Fatalf("subject %q, want empty", leaf.Subject)
	case leaf.IsCA:
		t.Fatal("leaf is a CA")
	case leaf.KeyUsage != x509.KeyUsageDigitalSignature:
		t.Fatalf("key usage %q, want exactly digital signature", csr.Usages{Key: leaf.KeyUsage}.Names())
	case !csr.SamePublicKey(leaf.PublicKey, key.Public()):
		t.Fatal("leaf does not certify the CSR's key")
	}
	if d := leaf.NotAfter.Sub(before.Add(ttl)); d < -10*time.Minute || d > Tolerance {
		t.Errorf("TTL %v: NotAfter %v, want %v", ttl, leaf.NotAfter, before.Add(ttl))
	}
	for _, use := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		for _, name := range DNSNames {
			_, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: certs.Pool(a.Roots...),
				Intermediates: certs.Pool(res.Intermediates...), KeyUsages: []x509.ExtKeyUsage{use}})
			if err != nil {
				t.Fatalf("leaf does not verify for %s and %v: %v", name, use, err)
			}
		}
	}
}
