package csr_test

import (
	"bytes"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"net"
	"net/url"
	"testing"

	"github.com/meshca/meshca/csr"
)

// knownReasons are the reasons Parse and Check may give.
var knownReasons = map[csr.Reason]bool{
	csr.ReasonMalformed: true, csr.ReasonTooLarge: true, csr.ReasonSignature: true,
	csr.ReasonIdentity: true, csr.ReasonExtraName: true, csr.ReasonExtension: true,
	csr.ReasonCA: true, csr.ReasonKey: true, csr.ReasonUsage: true,
}

// requireTyped fails unless err is a *csr.Error with a known reason and a
// detail.
func requireTyped(t *testing.T, err error) {
	t.Helper()
	var cerr *csr.Error
	if !errors.As(err, &cerr) {
		t.Fatalf("error %v (%T) is not a *csr.Error", err, err)
	}
	if !knownReasons[cerr.Reason] || cerr.Detail == "" {
		t.Fatalf("error %#v has an unknown reason or no detail", cerr)
	}
}

// FuzzParse feeds Parse arbitrary bytes. It must never panic; a request it
// accepts has a valid signature and is one PEM block with nothing but white
// space around it; every refusal is a typed error; and CheckStub accepts
// only a request that asks for nothing but its key.
func FuzzParse(f *testing.F) {
	valid := ztunnelPEM(f, p256Key(), testID)
	f.Add(valid)
	f.Add(ztunnelPEM(f, ed25519Key(), testID))
	f.Add(ztunnelPEM(f, p384Key(), otherID))
	f.Add(pemCSR(createDER(f, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: testID.String()},
		DNSNames: []string{"httpbin.default.svc"},
	}, p256Key())))
	f.Add([]byte{})
	f.Add([]byte("garbage"))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n"))
	f.Add(append([]byte("garbage\n"), valid...))
	f.Add(append(append([]byte{}, valid...), valid...))
	f.Add(pemCSR([]byte{0x30, 0x03, 0x02, 0x01, 0x00}))

	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := csr.Parse(data)
		if err != nil {
			if req != nil {
				t.Fatalf("Parse returned a request along with error %v", err)
			}
			requireTyped(t, err)
			return
		}
		if err := req.CheckSignature(); err != nil {
			t.Fatalf("Parse accepted a request whose signature does not verify: %v", err)
		}
		if len(data) > csr.MaxPEMSize {
			t.Fatalf("Parse accepted %d bytes", len(data))
		}
		trimmed := bytes.TrimSpace(data)
		if !bytes.HasPrefix(trimmed, []byte("-----BEGIN ")) || !bytes.HasSuffix(trimmed, []byte("-----")) {
			t.Fatalf("Parse accepted data with more than white space around the block: %q", data)
		}
		// A stub CheckStub accepts lends its key alone.
		if err := csr.CheckStub(req); err != nil {
			requireTyped(t, err)
		} else if len(req.Subject.Names) != 0 || len(req.Extensions) != 0 || len(req.DNSNames)+len(req.URIs)+len(req.IPAddresses)+len(req.EmailAddresses) != 0 {
			t.Fatalf("CheckStub accepted a stub with a subject %q, extensions %v", req.Subject, req.Extensions)
		}
	})
}

// FuzzCheck feeds Policy.Check requests made from arbitrary DER. The
// request is parsed without checking its signature, so that mutations
// reach Check; Check never relies on the signature. Check must never panic,
// and a request it accepts must name exactly the fixed identity: one URI
// equal to it, and no DNS, IP or email name.
func FuzzCheck(f *testing.F) {
	id := testID.String()
	idURL, err := url.Parse(id)
	if err != nil {
		f.Fatal(err)
	}
	ztunnel := pemDER(f, ztunnelPEM(f, p256Key(), testID))
	f.Add(ztunnel)
	f.Add(pemDER(f, ztunnelPEM(f, ed25519Key(), testID)))
	f.Add(pemDER(f, ztunnelPEM(f, p256Key(), otherID)))
	for _, tmpl := range []*x509.CertificateRequest{
		{URIs: []*url.URL{idURL}, DNSNames: []string{"httpbin.default.svc"}},
		{URIs: []*url.URL{idURL}, IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}},
		{URIs: []*url.URL{idURL}, EmailAddresses: []string{"a@example.com"}},
		{URIs: []*url.URL{idURL}, Subject: pkix.Name{CommonName: id}},
		{URIs: []*url.URL{idURL}, ExtraExtensions: []pkix.Extension{
			keyUsageExt(f, x509.KeyUsageDigitalSignature),
			extKeyUsageExt(f, oidEKUServerAuth, oidEKUClientAuth),
		}},
		{URIs: []*url.URL{idURL}, ExtraExtensions: []pkix.Extension{basicConstraintsExt(f, true)}},
		{ExtraExtensions: []pkix.Extension{sanExt(f, uriName(id), uriName(id))}},
		{ExtraExtensions: []pkix.Extension{sanExt(f, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, IsCompound: true, Bytes: []byte(id)})}},
	} {
		f.Add(createDER(f, tmpl, p256Key()))
	}
	f.Add([]byte{})
	f.Add([]byte{0x30, 0x00})

	policy := csr.DefaultPolicy()
	f.Fuzz(func(t *testing.T, der []byte) {
		req, err := x509.ParseCertificateRequest(der)
		if err != nil {
			return
		}
		if err := policy.Check(req, testID); err != nil {
			requireTyped(t, err)
			return
		}
		if len(req.URIs) != 1 || req.URIs[0].String() != id {
			t.Fatalf("Check accepted a request with URIs %v, want [%s]", req.URIs, id)
		}
		if len(req.DNSNames) != 0 || len(req.IPAddresses) != 0 || len(req.EmailAddresses) != 0 {
			t.Fatalf("Check accepted a request with DNS %q, IP %v, email %q", req.DNSNames, req.IPAddresses, req.EmailAddresses)
		}
		if cn := req.Subject.CommonName; cn != "" && cn != id {
			t.Fatalf("Check accepted a request with common name %q", cn)
		}
	})
}
