package certs_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr/certs"
)

func TestWindow(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	root := testca.NewRoot(t, "window root", testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)})
	young := testca.NewRoot(t, "young root", testca.Options{NotBefore: now.Add(-30 * time.Second), NotAfter: now.Add(time.Hour)})
	tests := []struct {
		name          string
		o             certs.WindowOptions
		issuer        *testca.CA
		before, after time.Time
	}{
		{"default backdate", certs.WindowOptions{Now: now, TTL: time.Minute}, root, now.Add(-certs.Backdate), now.Add(time.Minute)},
		{"one second", certs.WindowOptions{Now: now, TTL: time.Minute, Backdate: time.Second}, root, now.Add(-time.Second), now.Add(time.Minute)},
		{"none", certs.WindowOptions{Now: now, TTL: time.Minute, Backdate: certs.NoBackdate}, root, now, now.Add(time.Minute)},
		{"not before the issuer", certs.WindowOptions{Now: now, TTL: time.Minute}, young, now.Add(-30 * time.Second), now.Add(time.Minute)},
		{"not after the issuer", certs.WindowOptions{Now: now, TTL: 2 * time.Hour, Backdate: time.Second}, root, now.Add(-time.Second), now.Add(time.Hour)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nb, na := certs.Window(tt.o, tt.issuer.Cert)
			if !nb.Equal(tt.before) || !na.Equal(tt.after) {
				t.Fatalf("Window = %v..%v, want %v..%v", nb, na, tt.before, tt.after)
			}
		})
	}
}

// TestPathExpiry: the earliest expiry of the signing path, whichever
// certificate holds it, found without allocating (it runs per leaf).
func TestPathExpiry(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	root := testca.NewRoot(t, "path root", testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(3 * time.Hour)})
	inter := root.NewIntermediate(t, "path intermediate", testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(2 * time.Hour)})
	short := root.NewIntermediate(t, "short intermediate", testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)})
	if got := certs.PathExpiry(inter.Cert, root.Cert); !got.Equal(inter.Cert.NotAfter) {
		t.Errorf("issuer first to expire: got %v, want %v", got, inter.Cert.NotAfter)
	}
	if got := certs.PathExpiry(root.Cert, short.Cert); !got.Equal(short.Cert.NotAfter) {
		t.Errorf("chain first to expire: got %v, want %v", got, short.Cert.NotAfter)
	}
	chain := []*x509.Certificate{root.Cert}
	if n := testing.AllocsPerRun(100, func() { _ = certs.PathExpiry(inter.Cert, chain...) }); n != 0 {
		t.Errorf("PathExpiry allocates %v times per call", n)
	}
}

// TestSubjectKeyIDOfECKeys: the shortcut for EC keys gives the SHA-1 of
// the subjectPublicKey bit string, as the ASN.1 route does.
func TestSubjectKeyIDOfECKeys(t *testing.T) {
	for _, curve := range []elliptic.Curve{elliptic.P256(), elliptic.P384(), elliptic.P521()} {
		key, err := ecdsa.GenerateKey(curve, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.MarshalPKIXPublicKey(key.Public())
		if err != nil {
			t.Fatal(err)
		}
		var spki struct {
			Algorithm pkix.AlgorithmIdentifier
			PublicKey asn1.BitString
		}
		if _, err := asn1.Unmarshal(der, &spki); err != nil {
			t.Fatal(err)
		}
		want := sha1.Sum(spki.PublicKey.Bytes)
		got, err := certs.SubjectKeyID(key.Public())
		if err != nil || !bytes.Equal(got, want[:]) {
			t.Errorf("%s: got %x (%v), want %x", curve.Params().Name, got, err, want)
		}
	}
}

func TestGenerateKeyUnknown(t *testing.T) {
	if _, err := certs.GenerateKey("dsa-1024"); err == nil {
		t.Fatal("want an error")
	}
}
