package csr_test

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	"github.com/meshca/meshca/csr"
)

var istiodNames = []string{"istiod.istio-system.svc", "istiod-canary.istio-system.svc"}

func TestBuildDNSPassesCheckDNS(t *testing.T) {
	p, err := csr.BuildDNS(p256Key(), istiodNames)
	if err != nil {
		t.Fatal(err)
	}
	req, err := csr.Parse(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := csr.DefaultPolicy().CheckDNS(req, istiodNames); err != nil {
		t.Fatalf("CheckDNS of BuildDNS's own request: %v", err)
	}
	// The same request in another order of names passes too: a set.
	if err := csr.DefaultPolicy().CheckDNS(req, []string{istiodNames[1], istiodNames[0]}); err != nil {
		t.Fatalf("CheckDNS with the names reordered: %v", err)
	}
	if len(req.Subject.Names) != 0 {
		t.Fatalf("subject %q, want empty", req.Subject)
	}
	for _, e := range req.Extensions {
		if e.Id.Equal(oidSAN) && !e.Critical {
			t.Fatal("subjectAltName is not critical though the subject is empty")
		}
	}
}

func TestCheckDNS(t *testing.T) {
	dns := func(n string) asn1.RawValue {
		return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, Bytes: []byte(n)}
	}
	uri := asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(testID.String())}
	tests := []struct {
		name    string
		tmpl    func(t *testing.T) *x509.CertificateRequest
		reason  csr.Reason
		message string
	}{
		{"exact names", func(t *testing.T) *x509.CertificateRequest {
			return &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{sanExt(t, dns(istiodNames[0]), dns(istiodNames[1]))}}
		}, "", ""},
		{"one name missing", func(t *testing.T) *x509.CertificateRequest {
			return &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{sanExt(t, dns(istiodNames[0]))}}
		}, csr.ReasonIdentity, "holds 1 of the DNS names"},
		{"another name", func(t *testing.T) *x509.CertificateRequest {
			return &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{sanExt(t, dns(istiodNames[0]), dns("kubernetes.default.svc"))}}
		}, csr.ReasonIdentity, `names "kubernetes.default.svc"`},
		{"a name twice", func(t *testing.T) *x509.CertificateRequest {
			return &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{sanExt(t, dns(istiodNames[0]), dns(istiodNames[0]))}}
		}, csr.ReasonIdentity, "or names it twice"},
		{"a SPIFFE ID besides", func(t *testing.T) *x509.CertificateRequest {
			return &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{sanExt(t, dns(istiodNames[0]), dns(istiodNames[1]), uri)}}
		}, csr.ReasonExtraName, "holds a URI"},
		{"no subjectAltName", func(t *testing.T) *x509.CertificateRequest {
			return &x509.CertificateRequest{}
		}, csr.ReasonIdentity, "it must hold exactly " + strings.Join(istiodNames, ",")},
		{"a common name", func(t *testing.T) *x509.CertificateRequest {
			return &x509.CertificateRequest{Subject: pkix.Name{CommonName: istiodNames[0]},
				ExtraExtensions: []pkix.Extension{sanExt(t, dns(istiodNames[0]), dns(istiodNames[1]))}}
		}, csr.ReasonExtraName, "subject common name"},
		{"a CA", func(t *testing.T) *x509.CertificateRequest {
			bc, _ := asn1.Marshal(struct{ IsCA bool }{true})
			return &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{
				sanExt(t, dns(istiodNames[0]), dns(istiodNames[1])), {Id: oidBasicConstraints, Value: bc}}}
		}, csr.ReasonCA, "CA:true"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			der, err := x509.CreateCertificateRequest(rand.Reader, tt.tmpl(t), p256Key())
			if err != nil {
				t.Fatal(err)
			}
			req, err := csr.Parse(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
			if err != nil {
				t.Fatal(err)
			}
			err = csr.DefaultPolicy().CheckDNS(req, istiodNames)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("CheckDNS: %v", err)
				}
				return
			}
			var ce *csr.Error
			if !errors.As(err, &ce) || ce.Reason != tt.reason || !strings.Contains(ce.Detail, tt.message) {
				t.Fatalf("CheckDNS = %v, want reason %s with %q", err, tt.reason, tt.message)
			}
		})
	}
}

// TestCheckRefusesDNSRequests: a workload's Check never passes a request
// for DNS names, whatever identity is asked.
func TestCheckRefusesDNSRequests(t *testing.T) {
	p, err := csr.BuildDNS(p256Key(), istiodNames)
	if err != nil {
		t.Fatal(err)
	}
	req, err := csr.Parse(p)
	if err != nil {
		t.Fatal(err)
	}
	var ce *csr.Error
	if err := csr.DefaultPolicy().Check(req, testID); !errors.As(err, &ce) || ce.Reason != csr.ReasonExtraName {
		t.Fatalf("Check of a DNS request = %v, want %s", err, csr.ReasonExtraName)
	}
}
