package crlverify_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"math/big"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness/crlverify"
	"github.com/meshca/meshca/internal/testca"
)

// revoke makes a v2 CRL of issuer (signed with its key; the issuer's
// certificate is given cRLSign for x509.CreateRevocationList's sake,
// whatever it has) valid from this to next, listing serials.
func revoke(t *testing.T, issuer *x509.Certificate, key crypto.Signer, this, next time.Time, serials ...*big.Int) []byte {
	t.Helper()
	signer := *issuer
	signer.KeyUsage |= x509.KeyUsageCRLSign
	tmpl := &x509.RevocationList{Number: big.NewInt(time.Now().UnixNano()), ThisUpdate: this, NextUpdate: next}
	for _, s := range serials {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries,
			x509.RevocationListEntry{SerialNumber: s, RevocationTime: this, ReasonCode: 1})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, &signer, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// v1 re-signs a v2 CRL as version 1: without the version and the
// extensions.
func v1(t *testing.T, der []byte, key crypto.Signer) []byte {
	t.Helper()
	var outer struct {
		TBS    asn1.RawValue
		SigAlg asn1.RawValue
		Sig    asn1.BitString
	}
	if _, err := asn1.Unmarshal(der, &outer); err != nil {
		t.Fatal(err)
	}
	var parts []asn1.RawValue
	for rest := outer.TBS.Bytes; len(rest) > 0; {
		var v asn1.RawValue
		var err error
		if rest, err = asn1.Unmarshal(rest, &v); err != nil {
			t.Fatal(err)
		}
		parts = append(parts, v)
	}
	parts = parts[1:] // the version
	if last := parts[len(parts)-1]; last.Class == asn1.ClassContextSpecific {
		parts = parts[:len(parts)-1] // the extensions
	}
	var body []byte
	for _, p := range parts {
		body = append(body, p.FullBytes...)
	}
	tbs, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: body})
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256(tbs)
	sig, err := key.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	out, err := asn1.Marshal(struct {
		TBS    asn1.RawValue
		SigAlg asn1.RawValue
		Sig    asn1.BitString
	}{asn1.RawValue{FullBytes: tbs}, outer.SigAlg, asn1.BitString{Bytes: sig, BitLength: 8 * len(sig)}})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// noCRLSign is a root whose key usage lacks cRLSign.
func noCRLSign(t *testing.T) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "root without cRLSign"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func pemOf(ders ...[]byte) []byte {
	var out []byte
	for _, d := range ders {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: d})...)
	}
	return out
}

// TestVerify: each case's CRL file and chain, judged by the strict rules,
// by ztunnel's, and by openssl verify -crl_check_all, which must agree
// with the strict rules but where a case says otherwise.
func TestVerify(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("openssl is needed (hack/deps.sh installs it)")
	}
	now := time.Now()
	past, future := now.Add(-time.Hour), now.Add(time.Hour)
	root := testca.NewRoot(t, "meshca root", testca.Options{})
	inter := root.NewIntermediate(t, "meshca intermediate", testca.Options{})
	impostor := testca.NewRoot(t, "meshca intermediate", testca.Options{}) // the intermediate's name, another key
	other := testca.NewRoot(t, "another root", testca.Options{})
	leaf := inter.Leaf(t, "spiffe://cluster.local/ns/a/sa/web", nil)
	direct := root.Leaf(t, "spiffe://cluster.local/ns/a/sa/direct", nil)
	bare, bareKey := noCRLSign(t)
	bareCA := &testca.CA{Cert: bare, Key: bareKey}
	bareLeaf := bareCA.Leaf(t, "spiffe://cluster.local/ns/a/sa/bare", nil)

	rootCRL := revoke(t, root.Cert, root.Key, past, future)
	interCRL := revoke(t, inter.Cert, inter.Key, past, future)
	chain := []*x509.Certificate{leaf, inter.Cert}
	roots := []*x509.Certificate{root.Cert, bare}
	for _, tc := range []struct {
		name            string
		file            []byte
		chain           []*x509.Certificate
		strict, ztunnel string // the Reason refused for; "" accepted
		openssl         bool   // openssl accepts
	}{
		{"every CA's CRL, nothing revoked", pemOf(rootCRL, interCRL), chain, "", "", true},
		{"the leaf revoked", pemOf(rootCRL, revoke(t, inter.Cert, inter.Key, past, future, leaf.SerialNumber)), chain,
			crlverify.ReasonRevoked, crlverify.ReasonRevoked, false},
		{"the intermediate revoked", pemOf(revoke(t, root.Cert, root.Key, past, future, inter.Cert.SerialNumber), interCRL), chain,
			crlverify.ReasonRevoked, crlverify.ReasonRevoked, false},
		{"no CRL of the root", pemOf(interCRL), chain, crlverify.ReasonUnknown, "", false},
		{"no CRL of the intermediate", pemOf(rootCRL), chain, crlverify.ReasonUnknown, "", false},
		{"only another CA's CRL", pemOf(revoke(t, other.Cert, other.Key, past, future)), chain, crlverify.ReasonUnknown, "", false},
		{"an empty file: nothing checked", nil, chain, "", "", true},
		{"PEM without a CRL: nothing checked", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Cert.Raw}), chain, "", "", true},
		{"the intermediate's CRL expired", pemOf(rootCRL, revoke(t, inter.Cert, inter.Key, now.Add(-2*time.Hour), past)), chain,
			crlverify.ReasonExpired, "", false},
		{"the intermediate's CRL not yet valid", pemOf(rootCRL, revoke(t, inter.Cert, inter.Key, future, now.Add(2*time.Hour))), chain,
			crlverify.ReasonNotYetValid, "", false},
		{"expired and revoked: still revoked for ztunnel", pemOf(rootCRL, revoke(t, inter.Cert, inter.Key, now.Add(-2*time.Hour), past,
			leaf.SerialNumber)), chain, crlverify.ReasonExpired, crlverify.ReasonRevoked, false},
		{"the intermediate's name, another key", pemOf(rootCRL, revoke(t, impostor.Cert, impostor.Key, past, future)), chain,
			crlverify.ReasonBadSignature, crlverify.ReasonBadSignature, false},
		{"the impostor's CRL first", pemOf(rootCRL, revoke(t, impostor.Cert, impostor.Key, past, future), interCRL), chain,
			crlverify.ReasonBadSignature, crlverify.ReasonBadSignature, true},
		{"an issuer without cRLSign", pemOf(revoke(t, bare, bareKey, past, future)), []*x509.Certificate{bareLeaf},
			crlverify.ReasonNotCRLSigner, crlverify.ReasonNotCRLSigner, false},
		{"one DER CRL", rootCRL, []*x509.Certificate{direct}, "", "", true},
		{"one DER CRL, revoked", revoke(t, root.Cert, root.Key, past, future, direct.SerialNumber), []*x509.Certificate{direct},
			crlverify.ReasonRevoked, crlverify.ReasonRevoked, false},
		{"a chain to no root", pemOf(rootCRL, interCRL), []*x509.Certificate{leaf}, crlverify.ReasonUntrusted, crlverify.ReasonUntrusted, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			crls, err := crlverify.Parse(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []struct {
				name   string
				policy crlverify.Policy
				want   string
			}{{"strict", crlverify.Strict, tc.strict}, {"ztunnel", crlverify.Ztunnel, tc.ztunnel}} {
				err := crlverify.Verifier{Roots: roots, CRLs: crls, Policy: p.policy}.Verify(tc.chain, now)
				var e *crlverify.Error
				switch {
				case p.want == "" && err != nil:
					t.Errorf("%s: %v, want accepted", p.name, err)
				case p.want != "" && (!errors.As(err, &e) || e.Reason != p.want):
					t.Errorf("%s: %v, want refused: %s", p.name, err, p.want)
				}
			}
			err = crlverify.OpenSSL(context.Background(), t.TempDir(), roots, tc.chain, tc.file, now)
			if (err == nil) != tc.openssl {
				t.Errorf("openssl: %v, want accepted %v", err, tc.openssl)
			}
		})
	}
}

// TestParse: a file whose CRL does not parse is unusable as a whole, as
// ztunnel refuses it; a v1 CRL among them, which openssl would take.
func TestParse(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	good := revoke(t, root.Cert, root.Key, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	leaf := root.Leaf(t, "spiffe://cluster.local/ns/a/sa/web", nil)
	old := pemOf(good, v1(t, good, root.Key))
	if err := crlverify.OpenSSL(context.Background(), t.TempDir(), []*x509.Certificate{root.Cert},
		[]*x509.Certificate{leaf}, old, time.Now()); err != nil {
		t.Errorf("openssl refuses the v1 CRL: %v", err)
	}
	for _, tc := range []struct {
		name    string
		file    []byte
		n       int
		wantErr string
	}{
		{"two PEM CRLs", pemOf(good, good), 2, ""},
		{"whitespace only", []byte("\n \n"), 0, ""},
		{"a broken CRL after a good one", append(pemOf(good), pemOf([]byte("not a CRL"))...), 0, "CRL 2"},
		{"DER that is no CRL", []byte{0x30, 0x03, 0x02, 0x01, 0x01}, 0, "DER CRL"},
		{"a v1 CRL", old, 0, "CRL 2: x509: unsupported crl version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			crls, err := crlverify.Parse(tc.file)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(crls) != tc.n {
				t.Fatalf("%d CRLs, %v; want %d", len(crls), err, tc.n)
			}
		})
	}
}
