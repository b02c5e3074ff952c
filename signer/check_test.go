package signer_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/signer"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TestCheckIssued: every rule of CheckIssued, on leaves a permissive or
// careless backend could issue. want is "" for a leaf that passes, else a
// fragment of the refusal.
func TestCheckIssued(t *testing.T) {
	ca := testca.NewRoot(t, "check root", testca.Options{})
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/a/sa/b")
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	start := time.Now()
	lifetime := signer.Lifetime{Start: start, IssuerNotAfter: start.Add(2 * time.Hour)}
	tests := []struct {
		name string
		key  crypto.Signer
		edit func(*x509.Certificate)
		want string
	}{
		{"EC workload leaf", ecKey, nil, ""},
		{"RSA workload leaf", rsaKey, nil, ""},
		{"subject copied from the CSR", ecKey, func(c *x509.Certificate) {
			c.Subject = pkix.Name{Organization: []string{"system:masters"}, OrganizationalUnit: []string{"ops"}}
		}, "want an empty subject"},
		{"common name equal to the identity", ecKey, func(c *x509.Certificate) {
			c.Subject = pkix.Name{CommonName: id.String()}
		}, "want an empty subject"},
		{"empty organization (istio-agent's CSR subject)", ecKey, func(c *x509.Certificate) {
			c.Subject = pkix.Name{Organization: []string{""}}
		}, "want an empty subject"},
		{"extra DNS name", ecKey, func(c *x509.Certificate) { c.DNSNames = []string{"evil.example"} }, "names 2 subject alternative names"},
		{"extra otherName crypto/x509 does not surface", ecKey, func(c *x509.Certificate) {
			c.URIs = nil
			c.ExtraExtensions = []pkix.Extension{sanExtension(t, true, uriName(id.String()), otherName(t))}
		}, "a general name with tag 0"},
		{"another identity", ecKey, func(c *x509.Certificate) {
			c.URIs = []*url.URL{spiffeid.RequireFromString("spiffe://cluster.local/ns/kube-system/sa/admin").URL()}
		}, "want exactly the URI " + id.String()},
		{"no SAN", ecKey, func(c *x509.Certificate) { c.URIs = nil }, "0 subjectAltName extensions"},
		{"SAN not critical with an empty subject", ecKey, func(c *x509.Certificate) {
			c.URIs = nil
			c.ExtraExtensions = []pkix.Extension{sanExtension(t, false, uriName(id.String()))}
		}, "not critical"},
		{"RSA leaf without key encipherment", rsaKey, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature }, `lacks key usage ["key encipherment"]`},
		{"EC leaf with key encipherment", ecKey, func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageKeyEncipherment }, "goes beyond the allowed"},
		{"no digital signature", ecKey, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageKeyAgreement }, "goes beyond the allowed"},
		{"cert sign", ecKey, func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageCertSign }, "goes beyond the allowed"},
		{"a CA", ecKey, func(c *x509.Certificate) { c.IsCA = true }, "is a CA"},
		{"code signing", ecKey, func(c *x509.Certificate) { c.ExtKeyUsage = append(c.ExtKeyUsage, x509.ExtKeyUsageCodeSigning) }, "not allowed for workloads"},
		{"unknown extended key usage", ecKey, func(c *x509.Certificate) { c.UnknownExtKeyUsage = []asn1.ObjectIdentifier{{1, 2, 3, 4}} }, "that workloads may not have"},
		{"no client auth", ecKey, func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} }, "lacks extended key usage"},
		{"outlives its issuer", ecKey, func(c *x509.Certificate) { c.NotAfter = lifetime.IssuerNotAfter.Add(time.Hour) }, "after its issuer"},
		{"outlives the requested lifetime (a role with not_after, a profile's expiry)", ecKey, func(c *x509.Certificate) {
			c.NotAfter = start.Add(time.Hour + signer.LifetimeSlack + time.Second)
		}, "past the requested lifetime (until " + start.Add(time.Hour).UTC().Format(time.RFC3339) + ")"},
		{"ends within the slack for the backend's clock", ecKey, func(c *x509.Certificate) { c.NotAfter = start.Add(time.Hour + signer.LifetimeSlack) }, ""},
		{"what Vault and cfssl add: key IDs, AIA, CRL distribution points, certificate policies", ecKey, func(c *x509.Certificate) {
			c.SubjectKeyId = []byte{1, 2, 3, 4}
			c.OCSPServer, c.IssuingCertificateURL = []string{"http://ocsp.example"}, []string{"http://ca.example/ca.der"}
			c.CRLDistributionPoints = []string{"http://ca.example/crl"}
			c.PolicyIdentifiers = []asn1.ObjectIdentifier{{2, 23, 140, 1, 2, 1}}
		}, ""},
		{"name constraints", ecKey, withExtension(t, asn1.ObjectIdentifier{2, 5, 29, 30},
			nameConstraints{Permitted: []generalSubtree{{Base: uriName("other.example")}}}), "carries the nameConstraints extension"},
		{"policy mappings", ecKey, withExtension(t, asn1.ObjectIdentifier{2, 5, 29, 33},
			[]policyMapping{{asn1.ObjectIdentifier{1, 2, 3}, asn1.ObjectIdentifier{2, 23, 140, 1, 2, 1}}}), "carries the policyMappings extension"},
		{"policy constraints: explicit policy required at once", ecKey, withExtension(t, asn1.ObjectIdentifier{2, 5, 29, 36},
			policyConstraints{RequireExplicitPolicy: 0}), "carries the policyConstraints extension"},
		{"inhibitAnyPolicy", ecKey, withExtension(t, asn1.ObjectIdentifier{2, 5, 29, 54}, 0), "carries the inhibitAnyPolicy extension"},
		{"Microsoft application policies: code signing", ecKey, withExtension(t, asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 21, 10},
			[]policyInformation{{asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 3}}}), "carries the Microsoft application policies extension"},
		{"Microsoft application policies: server and client auth, as AD CS repeats the usages", ecKey, withExtension(t, asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 21, 10},
			[]policyInformation{{asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 1}}, {asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 2}}}), ""},
		{"another key", ecKey, func(c *x509.Certificate) { c.PublicKey = otherKey.Public() }, "does not certify the CSR's key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			usages := csr.WorkloadUsages(tt.key.Public())
			tmpl := &x509.Certificate{
				SerialNumber:          big.NewInt(7),
				NotBefore:             time.Now().Add(-time.Minute),
				NotAfter:              time.Now().Add(time.Hour),
				URIs:                  []*url.URL{id.URL()},
				KeyUsage:              usages.Key,
				ExtKeyUsage:           usages.Ext,
				BasicConstraintsValid: true,
				PublicKey:             tt.key.Public(),
			}
			if tt.edit != nil {
				tt.edit(tmpl)
			}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, tmpl.PublicKey, ca.Key)
			if err != nil {
				t.Fatal(err)
			}
			leaf, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			req := &signer.Request{CSR: &x509.CertificateRequest{PublicKey: tt.key.Public()}, ID: id, TTL: time.Hour, Usages: usages}
			err = signer.CheckIssued("test", req, leaf, lifetime)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("CheckIssued: %v, want success", err)
			case tt.want == "":
			case signer.KindOf(err) != signer.KindRefused || !strings.Contains(err.Error(), tt.want):
				t.Fatalf("CheckIssued: %v, want a refusal containing %q", err, tt.want)
			}
		})
	}
}

func uriName(u string) asn1.RawValue {
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(u)}
}

// otherName is an otherName general name (tag 0) with a made-up type.
func otherName(t *testing.T) asn1.RawValue {
	t.Helper()
	typeID, err := asn1.Marshal(asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1})
	if err != nil {
		t.Fatal(err)
	}
	utf8, err := asn1.MarshalWithParams("system:masters", "utf8")
	if err != nil {
		t.Fatal(err)
	}
	value, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: utf8})
	if err != nil {
		t.Fatal(err)
	}
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: append(typeID, value...)}
}

func sanExtension(t *testing.T, critical bool, names ...asn1.RawValue) pkix.Extension {
	t.Helper()
	der, err := asn1.Marshal(names)
	if err != nil {
		t.Fatal(err)
	}
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Critical: critical, Value: der}
}

// withExtension returns an edit that adds to a leaf the non-critical
// extension id holding the DER of value.
func withExtension(t *testing.T, id asn1.ObjectIdentifier, value any) func(*x509.Certificate) {
	t.Helper()
	der, err := asn1.Marshal(value)
	if err != nil {
		t.Fatal(err)
	}
	return func(c *x509.Certificate) {
		c.ExtraExtensions = append(c.ExtraExtensions, pkix.Extension{Id: id, Value: der})
	}
}

// ASN.1 values of the extensions only a CA may carry (RFC 5280, 4.2.1),
// and of Microsoft's application policies (certificatePolicies' syntax).
type (
	generalSubtree  struct{ Base asn1.RawValue }
	nameConstraints struct {
		Permitted []generalSubtree `asn1:"tag:0"`
	}
	policyMapping     struct{ IssuerDomainPolicy, SubjectDomainPolicy asn1.ObjectIdentifier }
	policyConstraints struct {
		RequireExplicitPolicy int `asn1:"tag:0"`
	}
	policyInformation struct{ PolicyIdentifier asn1.ObjectIdentifier }
)
