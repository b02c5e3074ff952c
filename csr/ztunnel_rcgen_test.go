package csr_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"os"
	"testing"

	"github.com/meshca/meshca/csr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// ztunnel's default build (feature tls-aws-lc; tls-ring likewise) makes
// its CSR with the rcgen crate, pinned at 0.14.8 in its Cargo.lock:
// src/tls/csr.rs, CsrOptions::generate (lines 66-80 at ztunnel
// 62d826530e5c) sets a P-256 key (PKCS_ECDSA_P256_SHA256), one URI SAN,
// an empty DistinguishedName and KeyIdMethod::Sha256, then calls
// serialize_request. rcgenInfo and rcgenCSR lay the request out as rcgen
// 0.14.8 writes it for those parameters (rcgen/src/certificate.rs,
// serialize_request_with_attributes, lines 339-420):
//
//   - version INTEGER 0 (line 391);
//   - subject: an empty SEQUENCE (lib.rs write_distinguished_name, line
//     777, with no entries);
//   - subjectPKInfo: id-ecPublicKey with the secp256r1 OID as parameter,
//     the uncompressed point (key_pair.rs line 779; sign_algo.rs line 188);
//   - attributes [0] IMPLICIT SET OF (line 398) holding one attribute,
//     extensionRequest (1.2.840.113549.1.9.14), whose SET holds one
//     Extensions SEQUENCE (write_extension_request_attribute, line 191)
//     of a single extension: subjectAltName, critical because the subject
//     is empty (write_subject_alt_names, line 282; the BOOLEAN written
//     only when true, lib.rs write_x509_extension, line 814), holding one
//     [6] IA5String URI. No keyUsage, extKeyUsage or basicConstraints
//     (none set); no subjectKeyIdentifier (KeyIdMethod is unused in a
//     CSR, lines 362-375);
//   - signatureAlgorithm ecdsa-with-SHA256 without parameters
//     (sign_algo.rs line 188, key_pair.rs sign_der line 637) and the
//     DER ECDSA signature in a BIT STRING;
//   - PEM "CERTIFICATE REQUEST", 64-character lines, LF endings (lib.rs
//     ENCODE_CONFIG, line 296), as encoding/pem writes it.
//
// testdata/ztunnel-rcgen.pem is rcgenCSR's output for testID, printed
// once; TestZtunnelRcgenCSR checks it is still exactly that form.

// tlv is one DER element: tag, definite length, content.
func tlv(tag byte, content ...[]byte) []byte {
	body := bytes.Join(content, nil)
	var n []byte
	switch l := len(body); {
	case l < 0x80:
		n = []byte{byte(l)}
	case l < 0x100:
		n = []byte{0x81, byte(l)}
	default:
		n = []byte{0x82, byte(l >> 8), byte(l)}
	}
	return append(append([]byte{tag}, n...), body...)
}

func oidDER(tb testing.TB, ids ...int) []byte {
	tb.Helper()
	b, err := asn1.Marshal(asn1.ObjectIdentifier(ids))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// rcgenInfo is the CertificationRequestInfo rcgen writes for pub and uri.
func rcgenInfo(tb testing.TB, pub *ecdsa.PublicKey, uri string) []byte {
	tb.Helper()
	point, err := pub.Bytes() // uncompressed, as ring and aws-lc export it
	if err != nil {
		tb.Fatal(err)
	}
	const (
		sequence, set, boolean, bitString, octetString = 0x30, 0x31, 0x01, 0x03, 0x04
		attributes, uriName                            = 0xa0, 0x86 // [0] constructed, [6] primitive
	)
	san := tlv(sequence,
		oidDER(tb, 2, 5, 29, 17),
		tlv(boolean, []byte{0xff}),
		tlv(octetString, tlv(sequence, tlv(uriName, []byte(uri)))))
	return tlv(sequence,
		[]byte{0x02, 0x01, 0x00},
		tlv(sequence),
		tlv(sequence,
			tlv(sequence, oidDER(tb, 1, 2, 840, 10045, 2, 1), oidDER(tb, 1, 2, 840, 10045, 3, 1, 7)),
			tlv(bitString, []byte{0}, point)),
		tlv(attributes,
			tlv(sequence, oidDER(tb, 1, 2, 840, 113549, 1, 9, 14),
				tlv(set, tlv(sequence, san)))))
}

// rcgenCSR is the PEM request ztunnel's rcgen build sends for uri.
func rcgenCSR(tb testing.TB, key *ecdsa.PrivateKey, uri string) []byte {
	tb.Helper()
	info := rcgenInfo(tb, &key.PublicKey, uri)
	digest := sha256.Sum256(info)
	sig, err := ecdsa.SignASN1(rand.Reader, key, digest[:])
	if err != nil {
		tb.Fatal(err)
	}
	der := tlv(0x30, info, tlv(0x30, oidDER(tb, 1, 2, 840, 10045, 4, 3, 2)), tlv(0x03, []byte{0}, sig))
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// TestZtunnelRcgenCSR: the request ztunnel's rcgen build sends, freshly
// assembled and as committed in testdata, passes csr.ParseFor and the
// default policy for its SPIFFE ID and is refused for another; and
// csr.Build, meshca's own ztunnel-shaped request, has the same form byte
// for byte but for the key and the signature.
func TestZtunnelRcgenCSR(t *testing.T) {
	fixture, err := os.ReadFile("testdata/ztunnel-rcgen.pem")
	if err != nil {
		t.Fatal(err)
	}
	key := p256Key().(*ecdsa.PrivateKey)
	requests := []struct {
		name string
		pem  []byte
	}{
		{"assembled", rcgenCSR(t, key, testID.String())},
		{"testdata", fixture},
	}
	keys := csr.DefaultKeyPolicy()
	policy := csr.DefaultPolicy()
	for _, r := range requests {
		req, err := csr.ParseFor(r.pem, &keys)
		if err != nil {
			t.Fatalf("%s: ParseFor: %v", r.name, err)
		}
		pub := req.PublicKey.(*ecdsa.PublicKey)
		if !bytes.Equal(req.RawTBSCertificateRequest, rcgenInfo(t, pub, testID.String())) {
			t.Errorf("%s: not rcgen's form", r.name)
		}
		switch {
		case len(req.RawSubject) != 2, len(req.Extensions) != 1, !req.Extensions[0].Critical,
			req.SignatureAlgorithm != x509.ECDSAWithSHA256, len(req.URIs) != 1:
			t.Errorf("%s: subject %x, extensions %+v, signature %v, URIs %v", r.name, req.RawSubject, req.Extensions, req.SignatureAlgorithm, req.URIs)
		}
		for _, tt := range []struct {
			name   string
			id     spiffeid.ID
			reason csr.Reason
		}{
			{"its own identity", testID, ""},
			{"another service account", otherID, csr.ReasonIdentity},
			{"another trust domain", spiffeid.RequireFromString("spiffe://other.domain/ns/default/sa/httpbin"), csr.ReasonIdentity},
		} {
			t.Run(r.name+"/"+tt.name, func(t *testing.T) {
				requireReason(t, policy.Check(req, tt.id), tt.reason, "may only receive "+tt.id.String())
			})
		}
	}

	built, err := x509.ParseCertificateRequest(pemBytes(t, ztunnelPEM(t, key, testID)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(built.RawTBSCertificateRequest, rcgenInfo(t, &key.PublicKey, testID.String())) {
		t.Error("csr.Build's request is not in rcgen's form")
	}
}

func pemBytes(tb testing.TB, data []byte) []byte {
	tb.Helper()
	b, _ := pem.Decode(data)
	if b == nil {
		tb.Fatal("no PEM block")
	}
	return b.Bytes
}
