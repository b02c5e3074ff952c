package csr_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"net/url"
	"testing"

	"github.com/meshca/meshca/csr"
)

// TestCheckStub: a stub as the kubelet makes it (an empty template) is
// accepted; one that asks for a name, an extension or an attribute is
// refused, saying what it asked for.
func TestCheckStub(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := url.Parse("spiffe://cluster.local/ns/kube-system/sa/admin")
	tests := []struct {
		name   string
		tmpl   *x509.CertificateRequest
		reason csr.Reason
		detail string
	}{
		{name: "the kubelet's", tmpl: &x509.CertificateRequest{}},
		{name: "a common name", tmpl: &x509.CertificateRequest{Subject: pkix.Name{CommonName: "web"}},
			reason: csr.ReasonExtraName, detail: "it has a subject (CN=web): a kubelet's stub carries the Pod's key alone"},
		{name: "an organisation", tmpl: &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{"system:masters"}}},
			reason: csr.ReasonExtraName, detail: "it has a subject (O=system:masters)"},
		{name: "a DNS name", tmpl: &x509.CertificateRequest{DNSNames: []string{"web.shop.svc"}},
			reason: csr.ReasonExtension, detail: "it asks for extension 2.5.29.17 (subjectAltName)"},
		{name: "another SPIFFE ID", tmpl: &x509.CertificateRequest{URIs: []*url.URL{other}},
			reason: csr.ReasonExtension, detail: "it asks for extension 2.5.29.17 (subjectAltName)"},
		//lint:ignore SA1019 how a request gets an attribute
		{name: "an attribute", tmpl: &x509.CertificateRequest{Attributes: []pkix.AttributeTypeAndValueSET{{
			Type: asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 7}, Value: [][]pkix.AttributeTypeAndValue{{{Type: asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 7}, Value: "secret"}}},
		}}}, reason: csr.ReasonExtension, detail: "it has attribute 1.2.840.113549.1.9.7"},
	}
	// crypto/x509 writes only attributes whose values are lists of type
	// and value, and reads back only those; a challengePassword is a
	// string, so its request is signed here.
	tests = append(tests, struct {
		name   string
		tmpl   *x509.CertificateRequest
		reason csr.Reason
		detail string
	}{name: "a challenge password", reason: csr.ReasonExtension, detail: "it has attribute 1.2.840.113549.1.9.7"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var der []byte
			var err error
			if tt.tmpl == nil {
				der = requestWithPassword(t, key)
			} else if der, err = x509.CreateCertificateRequest(rand.Reader, tt.tmpl, key); err != nil {
				t.Fatal(err)
			}
			req, err := csr.Parse(pemCSR(der))
			if err != nil {
				t.Fatal(err)
			}
			requireReason(t, csr.CheckStub(req), tt.reason, tt.detail)
		})
	}
}

// requestWithPassword is a P-256 request with an empty subject, no
// extensions and a challengePassword attribute, signed by key.
func requestWithPassword(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	must := func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	password := must(asn1.MarshalWithParams("open sesame", "printable"))
	attr := must(asn1.Marshal(struct {
		Type   asn1.ObjectIdentifier
		Values []asn1.RawValue `asn1:"set"`
	}{asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 7}, []asn1.RawValue{{FullBytes: password}}}))
	info := must(asn1.Marshal(struct {
		Version    int
		Subject    asn1.RawValue
		PublicKey  asn1.RawValue
		Attributes []asn1.RawValue `asn1:"tag:0"`
	}{
		Subject:    asn1.RawValue{FullBytes: must(asn1.Marshal(pkix.RDNSequence{}))},
		PublicKey:  asn1.RawValue{FullBytes: must(x509.MarshalPKIXPublicKey(&key.PublicKey))},
		Attributes: []asn1.RawValue{{FullBytes: attr}},
	}))
	digest := sha256.Sum256(info)
	sig := must(ecdsa.SignASN1(rand.Reader, key, digest[:]))
	return must(asn1.Marshal(struct {
		Info      asn1.RawValue
		Algorithm pkix.AlgorithmIdentifier
		Signature asn1.BitString
	}{asn1.RawValue{FullBytes: info}, pkix.AlgorithmIdentifier{Algorithm: asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 2}},
		asn1.BitString{Bytes: sig, BitLength: 8 * len(sig)}}))
}
