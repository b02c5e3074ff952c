package caclient_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

var id = spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/frontend")

// reply returns a well-formed reply for key, signed by a fresh root.
func reply(t testing.TB, key *ecdsa.PrivateKey, uri string) []string {
	root := testca.NewRoot(t, "root", testca.Options{})
	u, _ := url.Parse(uri)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		URIs: []*url.URL{u}, KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root.Cert, key.Public(), root.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return []string{string(pemutil.EncodeCertificates(leaf)), string(pemutil.EncodeCertificates(root.Cert))}
}

func TestCheck(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	good := reply(t, key, id.String())
	tests := []struct {
		name  string
		chain []string
		want  string
	}{
		{"valid", good, ""},
		{"leaf only", good[:1], "no root certificate"},
		{"other identity", reply(t, key, "spiffe://cluster.local/ns/prod/sa/other"), "does not match"},
		{"other key", reply(t, other, id.String()), "does not certify our key"},
		{"foreign roots", []string{good[0], reply(t, key, id.String())[1]}, "does not verify"},
		{"garbage leaf", []string{"junk", good[1]}, "not one PEM certificate"},
		{"garbage roots", []string{good[0], "junk"}, "trust bundle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := caclient.Check(tt.chain, id, key)
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

// FuzzCheck: a reply from the network never panics the client.
func FuzzCheck(f *testing.F) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	good := reply(f, key, id.String())
	f.Add(good[0], good[1])
	f.Add("", "")
	f.Fuzz(func(t *testing.T, leaf, roots string) {
		_, _ = caclient.Check([]string{leaf, roots}, id, key)
	})
}
