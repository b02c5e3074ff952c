package csr_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"net"
	"net/url"
	"testing"

	"github.com/meshca/meshca/csr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

func TestPolicyCheck(t *testing.T) {
	id := testID.String()
	idURL, err := url.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	uris := []*url.URL{idURL}

	// tmpl returns a request template holding the URI SAN of testID and
	// the extra extensions given.
	tmpl := func(exts ...pkix.Extension) *x509.CertificateRequest {
		return &x509.CertificateRequest{URIs: uris, ExtraExtensions: exts}
	}
	san := func(t *testing.T, names ...asn1.RawValue) *x509.CertificateRequest {
		return &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{sanExt(t, names...)}}
	}

	tests := []struct {
		name string
		key  func() crypto.Signer // p256Key when nil
		// Exactly one of pem, tmpl and der makes the request.
		pem    func(t *testing.T, key crypto.Signer) []byte
		tmpl   func(t *testing.T) *x509.CertificateRequest
		der    func(t *testing.T) []byte
		reason csr.Reason // empty: the request passes
		detail string
	}{
		// ztunnel's request, for every kind of key the default policy allows.
		{name: "ztunnel P-256", pem: ztunnel(testID)},
		{name: "ztunnel P-384", key: p384Key, pem: ztunnel(testID)},
		{name: "ztunnel Ed25519", key: ed25519Key, pem: ztunnel(testID)},
		{name: "ztunnel RSA-2048", key: rsa2048Key, pem: ztunnel(testID)},
		{name: "ztunnel RSA-8192", key: rsa8192Key, pem: ztunnel(testID)},
		{name: "URI SAN made by x509", tmpl: func(t *testing.T) *x509.CertificateRequest { return tmpl() }},

		// Identity.
		{name: "different SPIFFE ID", pem: ztunnel(otherID), reason: csr.ReasonIdentity, detail: "may only receive " + id},
		{name: "other trust domain", pem: ztunnel(spiffeid.RequireFromString("spiffe://evil.example/ns/default/sa/httpbin")), reason: csr.ReasonIdentity, detail: "may only receive"},
		{name: "ID with a longer path", tmpl: func(t *testing.T) *x509.CertificateRequest { return san(t, uriName(id+"/x")) }, reason: csr.ReasonIdentity, detail: "may only receive"},
		{name: "ID in upper case", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return san(t, uriName("spiffe://CLUSTER.LOCAL/ns/default/sa/httpbin"))
		}, reason: csr.ReasonIdentity, detail: "may only receive"},
		{name: "no SAN", tmpl: func(t *testing.T) *x509.CertificateRequest { return &x509.CertificateRequest{} }, reason: csr.ReasonIdentity, detail: "no subjectAltName"},
		{name: "empty SAN", tmpl: func(t *testing.T) *x509.CertificateRequest { return san(t) }, reason: csr.ReasonIdentity, detail: "subjectAltName is empty"},

		// Other names.
		{name: "two URI SANs", tmpl: func(t *testing.T) *x509.CertificateRequest {
			ext, err := csr.MarshalURISAN(id, otherID.String())
			if err != nil {
				t.Fatal(err)
			}
			return &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{ext}}
		}, reason: csr.ReasonExtraName, detail: "holds 2 names"},
		{name: "the ID twice", tmpl: func(t *testing.T) *x509.CertificateRequest { return san(t, uriName(id), uriName(id)) }, reason: csr.ReasonExtraName, detail: "holds 2 names"},
		{name: "extra DNS SAN", tmpl: func(t *testing.T) *x509.CertificateRequest {
			r := tmpl()
			r.DNSNames = []string{"httpbin.default.svc"}
			return r
		}, reason: csr.ReasonExtraName, detail: "holds 2 names"},
		{name: "extra IP SAN", tmpl: func(t *testing.T) *x509.CertificateRequest {
			r := tmpl()
			r.IPAddresses = []net.IP{net.IPv4(10, 0, 0, 1)}
			return r
		}, reason: csr.ReasonExtraName, detail: "holds 2 names"},
		{name: "extra email SAN", tmpl: func(t *testing.T) *x509.CertificateRequest {
			r := tmpl()
			r.EmailAddresses = []string{"httpbin@example.com"}
			return r
		}, reason: csr.ReasonExtraName, detail: "holds 2 names"},
		{name: "DNS SAN only", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return &x509.CertificateRequest{DNSNames: []string{"httpbin.default.svc"}}
		}, reason: csr.ReasonExtraName, detail: "holds a DNS name"},
		{name: "IP SAN only", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return &x509.CertificateRequest{IPAddresses: []net.IP{net.ParseIP("2001:db8::1")}}
		}, reason: csr.ReasonExtraName, detail: "holds a IP address"},
		{name: "email SAN only", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return &x509.CertificateRequest{EmailAddresses: []string{"httpbin@example.com"}}
		}, reason: csr.ReasonExtraName, detail: "holds a email address"},
		{name: "otherName SAN holding the ID", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return san(t, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: mustMarshal(t, asn1.ObjectIdentifier{1, 2, 3})})
		}, reason: csr.ReasonExtraName, detail: "holds a otherName"},
		{name: "constructed URI tag holding the ID", tmpl: func(t *testing.T) *x509.CertificateRequest {
			// x509 does not see this name as a URI: req.URIs is empty.
			return san(t, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, IsCompound: true, Bytes: []byte(id)})
		}, reason: csr.ReasonExtraName, detail: "it must hold exactly the URI"},
		{name: "CN not the ID", tmpl: func(t *testing.T) *x509.CertificateRequest {
			r := tmpl()
			r.Subject.CommonName = "httpbin.default.svc"
			return r
		}, reason: csr.ReasonExtraName, detail: `common name "httpbin.default.svc"`},
		{name: "CN equal to the ID", tmpl: func(t *testing.T) *x509.CertificateRequest {
			r := tmpl()
			r.Subject.CommonName = id
			return r
		}},
		{name: "other subject attributes are ignored", tmpl: func(t *testing.T) *x509.CertificateRequest {
			r := tmpl()
			r.Subject.Organization = []string{"evil"}
			r.Subject.OrganizationalUnit = []string{"admins"}
			return r
		}},

		// Extensions.
		{name: "basicConstraints CA:true", tmpl: func(t *testing.T) *x509.CertificateRequest { return tmpl(basicConstraintsExt(t, true)) }, reason: csr.ReasonCA, detail: "CA:true"},
		{name: "basicConstraints CA:false", tmpl: func(t *testing.T) *x509.CertificateRequest { return tmpl(basicConstraintsExt(t, false)) }, reason: csr.ReasonExtension, detail: "basicConstraints is not allowed"},
		{name: "unknown extension", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(pkix.Extension{Id: asn1.ObjectIdentifier{1, 2, 3, 4}, Value: []byte{0x05, 0x00}})
		}, reason: csr.ReasonExtension, detail: "extension 1.2.3.4 is not allowed"},
		{name: "subjectKeyIdentifier", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(pkix.Extension{Id: oidSubjectKeyID, Value: mustMarshal(t, []byte{1, 2, 3})})
		}, reason: csr.ReasonExtension, detail: "extension 2.5.29.14 is not allowed"},
		{name: "malformed keyUsage", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(pkix.Extension{Id: oidKeyUsage, Value: mustMarshal(t, 5)})
		}, reason: csr.ReasonMalformed, detail: "cannot parse keyUsage"},
		{name: "malformed extKeyUsage", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(pkix.Extension{Id: oidExtKeyUsage, Value: mustMarshal(t, 5)})
		}, reason: csr.ReasonMalformed, detail: "cannot parse extKeyUsage"},
		{name: "malformed basicConstraints", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(pkix.Extension{Id: oidBasicConstraints, Value: mustMarshal(t, 5)})
		}, reason: csr.ReasonMalformed, detail: "cannot parse basicConstraints"},

		// Usages.
		{name: "keyUsage digitalSignature", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(keyUsageExt(t, x509.KeyUsageDigitalSignature))
		}},
		{name: "keyUsage certSign", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(keyUsageExt(t, x509.KeyUsageDigitalSignature|x509.KeyUsageCertSign))
		}, reason: csr.ReasonUsage, detail: `["cert sign"]`},
		{name: "keyUsage crlSign", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(keyUsageExt(t, x509.KeyUsageCRLSign))
		}, reason: csr.ReasonUsage, detail: `["crl sign"]`},
		{name: "keyUsage keyEncipherment ECDSA", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(keyUsageExt(t, x509.KeyUsageDigitalSignature|x509.KeyUsageKeyEncipherment))
		}, reason: csr.ReasonUsage, detail: `["key encipherment"]`},
		{name: "keyUsage keyEncipherment Ed25519", key: ed25519Key, tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(keyUsageExt(t, x509.KeyUsageKeyEncipherment))
		}, reason: csr.ReasonUsage, detail: `["key encipherment"]`},
		{name: "keyUsage keyEncipherment RSA-2048", key: rsa2048Key, tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(keyUsageExt(t, x509.KeyUsageDigitalSignature|x509.KeyUsageKeyEncipherment))
		}},
		{name: "keyUsage undefined bit 9", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(keyUsageExt(t, x509.KeyUsageDigitalSignature|1<<9))
		}, reason: csr.ReasonUsage, detail: "bit 9 is not defined"},
		{name: "EKU serverAuth and clientAuth", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(extKeyUsageExt(t, oidEKUServerAuth, oidEKUClientAuth))
		}},
		{name: "all allowed usages", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(keyUsageExt(t, x509.KeyUsageDigitalSignature), extKeyUsageExt(t, oidEKUClientAuth, oidEKUServerAuth))
		}},
		{name: "EKU codeSigning", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(extKeyUsageExt(t, oidEKUServerAuth, oidEKUCodeSigning))
		}, reason: csr.ReasonUsage, detail: `["code signing"]`},
		{name: "EKU any", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(extKeyUsageExt(t, oidEKUAny))
		}, reason: csr.ReasonUsage, detail: `["any"]`},
		{name: "EKU outside the vocabulary", tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(extKeyUsageExt(t, asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 10, 3, 1}))
		}, reason: csr.ReasonUsage, detail: "1.3.6.1.4.1.311.10.3.1 is not allowed"},

		// Keys.
		{name: "RSA-1024", key: rsa1024Key, pem: ztunnel(testID), reason: csr.ReasonKey, detail: "RSA key of 1024 bits"},
		{name: "P-521", key: p521Key, pem: ztunnel(testID), reason: csr.ReasonKey, detail: "ECDSA curve P-521 is not allowed"},
		{name: "P-224", der: func(t *testing.T) []byte {
			// x509 will not sign with P-224: sign a P-256 request again.
			der := createDER(t, tmpl(), p256Key())
			return withECDSAKey(t, der, p224Key().(*ecdsa.PrivateKey))
		}, reason: csr.ReasonKey, detail: "ECDSA curve P-224 is not allowed"},
		{name: "the key is checked first", key: rsa1024Key, tmpl: func(t *testing.T) *x509.CertificateRequest {
			return tmpl(basicConstraintsExt(t, true))
		}, reason: csr.ReasonKey, detail: "RSA key of 1024 bits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := p256Key()
			if tt.key != nil {
				key = tt.key()
			}
			var data []byte
			switch {
			case tt.pem != nil:
				data = tt.pem(t, key)
			case tt.tmpl != nil:
				data = pemCSR(createDER(t, tt.tmpl(t), key))
			case tt.der != nil:
				data = pemCSR(tt.der(t))
			}
			req := mustParse(t, data)
			err := csr.DefaultPolicy().Check(req, testID)
			requireReason(t, err, tt.reason, tt.detail)
			if err == nil && (len(req.URIs) != 1 || req.URIs[0].String() != id) {
				t.Fatalf("request passed with URIs %v", req.URIs)
			}
		})
	}
}

// TestPolicyCheckDuplicateExtension checks that Check refuses an extension
// requested twice. x509.ParseCertificateRequest already refuses such a
// request, so the parsed request is changed after parsing.
func TestPolicyCheckDuplicateExtension(t *testing.T) {
	for _, ext := range []pkix.Extension{
		sanExt(t, uriName(testID.String())),
		extKeyUsageExt(t, oidEKUServerAuth),
	} {
		t.Run(ext.Id.String(), func(t *testing.T) {
			data := pemCSR(createDER(t, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{ext}}, p256Key()))
			if _, err := csr.Parse(pemCSR(createDER(t, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{ext, ext}}, p256Key()))); err == nil {
				t.Error("Parse accepted a request with a duplicate extension")
			}
			req := mustParse(t, data)
			req.Extensions = append(req.Extensions, ext)
			requireReason(t, csr.DefaultPolicy().Check(req, testID), csr.ReasonMalformed, "appears twice")
		})
	}
}

// TestPolicyKeys checks that Policy.Check applies its key policy, not the
// default one.
func TestPolicyKeys(t *testing.T) {
	p521Only, err := csr.ParseKeyPolicy("ecdsa-p521")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		policy csr.Policy
		key    crypto.Signer
		reason csr.Reason
	}{
		{"P-521 allowed by policy", csr.Policy{Keys: p521Only}, p521Key(), ""},
		{"P-256 refused by policy", csr.Policy{Keys: p521Only}, p256Key(), csr.ReasonKey},
		{"zero policy refuses P-256", csr.Policy{}, p256Key(), csr.ReasonKey},
		{"zero policy refuses Ed25519", csr.Policy{}, ed25519Key(), csr.ReasonKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := mustParse(t, ztunnelPEM(t, tt.key, testID))
			requireReason(t, tt.policy.Check(req, testID), tt.reason, "")
		})
	}
}

func TestWorkloadUsages(t *testing.T) {
	ec := csr.WorkloadUsages(p256Key().Public())
	if got, want := ec.Strings(), []string{"digital signature", "server auth", "client auth"}; !equalStrings(got, want) {
		t.Errorf("ECDSA usages = %q, want %q", got, want)
	}
	rsa := csr.WorkloadUsages(rsa2048Key().Public())
	if got, want := rsa.Strings(), []string{"digital signature", "key encipherment", "server auth", "client auth"}; !equalStrings(got, want) {
		t.Errorf("RSA usages = %q, want %q", got, want)
	}
}

// ztunnel returns a maker of the request ztunnel sends for id.
func ztunnel(id spiffeid.ID) func(t *testing.T, key crypto.Signer) []byte {
	return func(t *testing.T, key crypto.Signer) []byte { return ztunnelPEM(t, key, id) }
}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	der, err := asn1.Marshal(v)
	if err != nil {
		t.Fatalf("asn1.Marshal: %v", err)
	}
	return der
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
