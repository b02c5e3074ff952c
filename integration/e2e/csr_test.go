package e2e

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"net/url"
	"strings"
	"testing"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/csr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCSRRefusals: a CSR asking for anything but exactly the caller's
// identity with workload usages is InvalidArgument, with a message naming
// the problem.
func TestCSRRefusals(t *testing.T) {
	s := startServer(t)
	w := cluster.NewWorkload(t, cluster.Namespace(t, "csr"), "frontend", "node-a")
	id := workloadID(w)
	other := spiffeid.RequireFromSegments(id.TrustDomain(), "ns", w.Namespace, "sa", "admin")
	p256 := func() crypto.Signer { k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader); return k }
	san := func(t *testing.T) pkix.Extension {
		e, err := csr.MarshalURISAN(id.String())
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	tests := []struct {
		name string
		csr  func(t *testing.T) string
		msg  string
	}{
		{"different SPIFFE ID", func(t *testing.T) string { return newCSR(t, other) }, "may only receive " + id.String()},
		{"extra DNS SAN", func(t *testing.T) string {
			u := id.URL()
			return build(t, p256(), &x509.CertificateRequest{URIs: []*url.URL{u}, DNSNames: []string{"evil.example.com"}})
		}, "subjectAltName holds 2 names"},
		{"CA:true", func(t *testing.T) string {
			bc, _ := asn1.Marshal(struct{ IsCA bool }{true})
			return build(t, p256(), &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{san(t), {Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: bc}}})
		}, "CA certificate"},
		{"cert sign usage", func(t *testing.T) string {
			ku, _ := asn1.Marshal(asn1.BitString{Bytes: []byte{0x84}, BitLength: 6}) // digitalSignature, keyCertSign
			return build(t, p256(), &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{san(t), {Id: asn1.ObjectIdentifier{2, 5, 29, 15}, Critical: true, Value: ku}}})
		}, "cert sign"},
		{"bad signature", func(t *testing.T) string {
			block, _ := pem.Decode([]byte(newCSR(t, id)))
			block.Bytes[len(block.Bytes)-3] ^= 0xff
			return string(pem.EncodeToMemory(block))
		}, "signature"},
		{"RSA-1024", func(t *testing.T) string {
			k, err := rsa.GenerateKey(rand.Reader, 1024)
			if err != nil {
				t.Skipf("this Go refuses RSA-1024 keys: %v", err)
			}
			return build(t, k, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{san(t)}})
		}, "1024"},
	}
	c := s.client(t, w.Token)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Call(context.Background(), tt.csr(t), id, caclient.Options{})
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tt.msg) {
				t.Fatalf("got %v %q, want InvalidArgument containing %q", st.Code(), st.Message(), tt.msg)
			}
		})
	}
}

func build(t *testing.T, key crypto.Signer, tmpl *x509.CertificateRequest) string {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}
