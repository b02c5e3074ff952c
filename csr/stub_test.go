package csr_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			der, err := x509.CreateCertificateRequest(rand.Reader, tt.tmpl, key)
			if err != nil {
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
