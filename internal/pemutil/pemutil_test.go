package pemutil_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/meshca/meshca/internal/pemutil"
)

func TestPrivateKeyRoundTrip(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	sec1, _ := x509.MarshalECPrivateKey(ec)
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	tests := []struct {
		name string
		pem  []byte
		want string
	}{
		{"pkcs8", mustEncode(t, ec), ""},
		{"sec1", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}), ""},
		{"pkcs1", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rk)}), ""},
		{"empty", nil, "no PEM data"},
		{"cert block", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}), "want a private key"},
		{"two blocks", append(mustEncode(t, ec), mustEncode(t, ec)...), "more than one PEM block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pemutil.ParsePrivateKey(tt.pem)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestParseCertificatesRefusesJunk(t *testing.T) {
	for _, in := range []string{"", "junk", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"} {
		if _, err := pemutil.ParseCertificates([]byte(in)); err == nil {
			t.Errorf("ParseCertificates(%q) succeeded", in)
		}
	}
}

func mustEncode(t *testing.T, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	b, err := pemutil.EncodePrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func FuzzParse(f *testing.F) {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	b, _ := pemutil.EncodePrivateKey(k)
	f.Add(b)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = pemutil.ParseCertificates(data)
		_, _ = pemutil.ParsePrivateKey(data)
	})
}
