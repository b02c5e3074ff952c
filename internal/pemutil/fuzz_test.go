package pemutil_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
)

// fuzzCA returns a CA certificate signed by parent (self-signed when
// parent is nil) and its key.
func fuzzCA(tb testing.TB, name string, parent *x509.Certificate, parentKey crypto.Signer) (*x509.Certificate, crypto.Signer) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"cluster.local"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return c, key
}

// certSeeds are inputs ParseCertificates meets: a root, a chain of an
// intermediate and its root as cert-chain.pem holds it, and near misses.
func certSeeds(f *testing.F) [][]byte {
	root, rootKey := fuzzCA(f, "root", nil, nil)
	inter, _ := fuzzCA(f, "intermediate", root, rootKey)
	one := pemutil.EncodeCertificates(root)
	chain := pemutil.EncodeCertificates(inter, root)
	return [][]byte{
		one,
		chain,
		append(append([]byte("\n\n"), chain...), "\n  \t\n"...),
		bytes.ReplaceAll(chain, []byte("\n"), []byte("\r\n")),
		append(append([]byte{}, one...), "trailing"...),
		append(append([]byte("Bag Attributes\n    friendlyName: root\nsubject=CN = root\n"), one...), "# end\n"...),
		append(append(append([]byte{}, one...), bytes.Replace(one, []byte("\nMII"), []byte("\n!MII"), 1)...), one...),
		append([]byte("  "), one...),
		append([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), one...),
		pem.EncodeToMemory(&pem.Block{Type: pemutil.TypeCertificate, Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: root.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: pemutil.TypeCertificate, Bytes: root.Raw[:len(root.Raw)/2]}),
		[]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"),
		{},
	}
}

// FuzzParseCertificates: certificate files and fields (root-cert.pem,
// cert-chain.pem, ca.crt, --trust-anchors, the CA state's root, cert and
// chain, a backend's answer) never panic the parser. What it accepts
// holds at least one certificate, every PEM block in it is a CERTIFICATE,
// and it encodes and parses again to the same certificates in the same
// order. (FuzzParseCertificatesStrict checks what lies between the
// blocks.)
func FuzzParseCertificates(f *testing.F) {
	for _, s := range certSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := pemutil.ParseCertificates(data)
		if err != nil {
			if certs != nil {
				t.Fatalf("ParseCertificates returned certificates along with %v", err)
			}
			return
		}
		if len(certs) == 0 {
			t.Fatal("ParseCertificates accepted data without a certificate")
		}
		for rest := data; ; {
			block, next := pem.Decode(rest)
			if block == nil {
				break
			}
			if block.Type != pemutil.TypeCertificate {
				t.Fatalf("ParseCertificates accepted a %q block", block.Type)
			}
			rest = next
		}
		again, err := pemutil.ParseCertificates(pemutil.EncodeCertificates(certs...))
		if err != nil {
			t.Fatalf("re-encoded certificates do not parse: %v", err)
		}
		if len(again) != len(certs) {
			t.Fatalf("re-encoding turned %d certificates into %d", len(certs), len(again))
		}
		for i := range certs {
			if !again[i].Equal(certs[i]) {
				t.Fatalf("re-encoding changed certificate %d", i+1)
			}
		}
	})
}

// FuzzParseCertificatesStrict: ParseCertificates accounts for all of
// what it accepts. Outside its CERTIFICATE blocks there is only
// explanatory text (RFC 7468, section 5.2: comments, openssl's "Bag
// Attributes" and -text output, the names in a CA bundle), never a block
// that does not decode: every BEGIN and END boundary in the data is one of
// a certificate it returns, so a damaged or truncated certificate is an
// error rather than one certificate fewer; and no block has headers.
//
// encoding/pem.Decode skips whatever precedes a BEGIN line that starts a
// block it can decode, undecodable blocks included, and ParseCertificates
// once returned what it decoded: a root-cert.pem or --trust-anchors file
// whose first root was damaged loaded with one root fewer. Regression
// seeds are in testdata/fuzz/FuzzParseCertificatesStrict.
func FuzzParseCertificatesStrict(f *testing.F) {
	for _, s := range certSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := pemutil.ParseCertificates(data)
		if err != nil {
			return
		}
		if b, e := bytes.Count(data, []byte("-----BEGIN")), bytes.Count(data, []byte("-----END")); b != len(certs) || e != len(certs) {
			t.Fatalf("ParseCertificates returned %d certificates from data with %d BEGIN and %d END boundaries", len(certs), b, e)
		}
		for rest := data; ; {
			block, next := pem.Decode(rest)
			if block == nil {
				break
			}
			if len(block.Headers) != 0 {
				t.Fatalf("ParseCertificates accepted a block with headers %v", block.Headers)
			}
			rest = next
		}
	})
}

// FuzzParsePrivateKey: key files and entries (ca-key.pem, tls.key, the
// CA state's key entries) never panic the parser. A key it accepts
// encodes as PKCS#8 and parses again to the same public key, and signs
// what its public key verifies.
func FuzzParsePrivateKey(f *testing.F) {
	ec256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ec384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		f.Fatal(err)
	}
	for _, k := range []crypto.Signer{ec256, ec384, ed, rk} {
		p, err := pemutil.EncodePrivateKey(k)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	sec1, _ := x509.MarshalECPrivateKey(ec256)
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}))
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rk)}))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		key, err := pemutil.ParsePrivateKey(data)
		if err != nil {
			if key != nil {
				t.Fatalf("ParsePrivateKey returned a key along with %v", err)
			}
			return
		}
		enc, err := pemutil.EncodePrivateKey(key)
		if err != nil {
			t.Fatalf("a parsed %T does not encode: %v", key, err)
		}
		again, err := pemutil.ParsePrivateKey(enc)
		if err != nil {
			t.Fatalf("a re-encoded %T does not parse: %v", key, err)
		}
		if !samePublic(t, key.Public(), again.Public()) {
			t.Fatalf("re-encoding changed the public key of a %T", key)
		}
		if err := signVerify(key); err != nil {
			t.Fatalf("a parsed %T cannot sign: %v", key, err)
		}
	})
}

func samePublic(t *testing.T, a, b crypto.PublicKey) bool {
	t.Helper()
	da, err := x509.MarshalPKIXPublicKey(a)
	if err != nil {
		t.Fatalf("public key %T does not marshal: %v", a, err)
	}
	db, err := x509.MarshalPKIXPublicKey(b)
	if err != nil {
		t.Fatalf("public key %T does not marshal: %v", b, err)
	}
	return bytes.Equal(da, db)
}

// signVerify signs a digest with key and verifies it with its public key.
func signVerify(key crypto.Signer) error {
	msg := []byte("meshca fuzz")
	digest := sha256.Sum256(msg)
	switch pub := key.Public().(type) {
	case *ecdsa.PublicKey:
		sig, err := key.Sign(rand.Reader, digest[:], crypto.SHA256)
		if err != nil {
			return err
		}
		if !ecdsa.VerifyASN1(pub, digest[:], sig) {
			return errors.New("ECDSA signature does not verify")
		}
	case *rsa.PublicKey:
		sig, err := key.Sign(rand.Reader, digest[:], crypto.SHA256)
		if err != nil {
			return err
		}
		return rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], sig)
	case ed25519.PublicKey:
		sig, err := key.Sign(rand.Reader, msg, crypto.Hash(0))
		if err != nil {
			return err
		}
		if !ed25519.Verify(pub, msg, sig) {
			return errors.New("Ed25519 signature does not verify")
		}
	default:
		return errors.New("unexpected public key type")
	}
	return nil
}
