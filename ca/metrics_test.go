package ca_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/internal/metricstest"
	"github.com/meshca/meshca/internal/testca"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/meshca/meshca/signer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// sample and wantSample read the series a test looks for.
var sample, wantSample = metricstest.Sample, metricstest.Want

// TestGRPCMetrics: every RPC is counted by method and code through the
// grpc-ecosystem provider, and every code's series exists from the start.
func TestGRPCMetrics(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	f := newFixture(t, root.Authority(), options{})
	if _, err := f.client(t, "good", nil).Fetch(context.Background(), frontend, caclient.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client(t, "bad", nil).Fetch(context.Background(), frontend, caclient.Options{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("bad token: %v, want Unauthenticated", err)
	}
	method := map[string]string{"grpc_service": "istio.v1.auth.IstioCertificateService", "grpc_method": "CreateCertificate", "grpc_type": "unary"}
	with := func(k, v string) map[string]string {
		l := map[string]string{k: v}
		for k, v := range method {
			l[k] = v
		}
		return l
	}
	for _, tt := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"grpc_server_started_total", method, 2},
		{"grpc_server_handled_total", with("grpc_code", "OK"), 1},
		{"grpc_server_handled_total", with("grpc_code", "Unauthenticated"), 1},
		{"grpc_server_handled_total", with("grpc_code", "ResourceExhausted"), 0},
		{"grpc_server_handling_seconds", method, 2},
		{"meshca_requests_total", map[string]string{"code": "OK", "reason": "ok"}, 1},
		{"meshca_requests_total", map[string]string{"code": "Unauthenticated", "reason": "test_bad_token"}, 1},
		{"meshca_sign_duration_seconds", map[string]string{"backend": "local"}, 1},
		{"meshca_sign_errors_total", map[string]string{"backend": "local", "kind": "unavailable"}, 0},
		{"citadel_server_csr_sign_err_count", map[string]string{"error": "CA_NOT_READY"}, 0},
		{"meshca_rate_limited_total", map[string]string{"reason": "too_many_requests"}, 0},
	} {
		wantSample(t, f.reg, tt.name, tt.labels, tt.want)
	}
}

// TestSignErrorMetrics: every backend error is counted once by backend
// and kind, and timed like an answer.
func TestSignErrorMetrics(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	for _, kind := range []signer.Kind{signer.KindUnavailable, signer.KindRefused, signer.KindInternal} {
		t.Run(string(kind), func(t *testing.T) {
			f := newFixture(t, root.Authority(), options{signer: failingSigner{kind}})
			if _, err := f.client(t, "good", nil).Fetch(context.Background(), frontend, caclient.Options{}); err == nil {
				t.Fatal("the failing backend issued")
			}
			for _, k := range []signer.Kind{signer.KindUnavailable, signer.KindRefused, signer.KindInternal} {
				want := 0.0
				if k == kind {
					want = 1
				}
				wantSample(t, f.reg, "meshca_sign_errors_total", map[string]string{"backend": "local", "kind": string(k)}, want)
			}
			wantSample(t, f.reg, "meshca_sign_duration_seconds", map[string]string{"backend": "local"}, 1)
		})
	}
}

// blockingSigner holds every request until released.
type blockingSigner struct {
	started chan struct{}
	release chan struct{}
}

func (s *blockingSigner) Sign(ctx context.Context, _ *signer.Request) (*signer.Response, error) {
	s.started <- struct{}{}
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return nil, signer.Errorf("test", signer.KindUnavailable, "released")
}

// TestRateLimitMetrics: a request refused because every issuance slot is
// taken is counted as rate limited, by reason.
func TestRateLimitMetrics(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	bs := &blockingSigner{started: make(chan struct{}, 1), release: make(chan struct{})}
	f := newFixture(t, root.Authority(), options{signer: bs, config: func(c *ca.Config) { c.MaxInFlight = 1 }})
	in := &authpb.IstioCertificateRequest{Csr: frontendCSR(t)}
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = f.srv.CreateCertificate(inProcess(context.Background(), "198.51.100.1:4000", "frontend-token"), in)
	})
	<-bs.started
	_, err := f.srv.CreateCertificate(inProcess(context.Background(), "198.51.100.2:4000", "frontend-token"), in)
	close(bs.release)
	wg.Wait()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second request: %v, want ResourceExhausted", err)
	}
	wantSample(t, f.reg, "meshca_rate_limited_total", map[string]string{"reason": "too_many_requests"}, 1)
	wantSample(t, f.reg, "meshca_rate_limited_total", map[string]string{"reason": "too_many_authentications"}, 0)
}

// TestIstioCSRErrorMetrics: Istio's citadel_server_csr_parsing_err_count
// moves on a CSR that does not parse, and
// citadel_server_id_extraction_err_count on one that parses but names no
// URI to take a SPIFFE ID from; neither moves on any other refusal (a
// CSR for another identity names one), nor on an issuance.
func TestIstioCSRErrorMetrics(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	weak, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	san := func(names ...asn1.RawValue) pkix.Extension {
		if names == nil {
			names = []asn1.RawValue{}
		}
		der, _ := asn1.Marshal(names)
		return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Critical: true, Value: der}
	}
	uri := func(s string) asn1.RawValue {
		return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(s)}
	}
	dns := func(s string) asn1.RawValue {
		return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, Bytes: []byte(s)}
	}
	der := func(tmpl *x509.CertificateRequest, k any) []byte {
		d, err := x509.CreateCertificateRequest(rand.Reader, tmpl, k)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	pemOf := func(d []byte) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: d}))
	}
	with := func(exts ...pkix.Extension) string {
		return pemOf(der(&x509.CertificateRequest{ExtraExtensions: exts}, key))
	}
	badSig := der(&x509.CertificateRequest{URIs: []*url.URL{frontend.URL()}}, key)
	badSig[len(badSig)-1] ^= 0xff
	tests := []struct {
		name       string
		csr        string
		token      string
		ttl        int64
		reason     string
		parse, ids float64
	}{
		{name: "issued", csr: frontendCSR(t), reason: "ok"},
		{name: "not PEM", csr: "hello", reason: "csr_malformed", parse: 1},
		{name: "PEM of no PKCS#10", csr: pemOf([]byte("garbage")), reason: "csr_malformed", parse: 1},
		{name: "over the size limit", csr: strings.Repeat("A", 17<<10), reason: "csr_too_large", parse: 1},
		{name: "a subjectAltName that does not parse", csr: with(pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: []byte{0x30, 0x03, 0x86}}),
			reason: "csr_malformed", parse: 1},
		{name: "no subjectAltName", csr: with(), reason: "csr_identity_mismatch", ids: 1},
		{name: "an empty subjectAltName", csr: with(san()), reason: "csr_identity_mismatch", ids: 1},
		{name: "a DNS name only", csr: with(san(dns("frontend.prod.svc"))), reason: "csr_extra_name", ids: 1},
		{name: "a common name and no subjectAltName", csr: pemOf(der(&x509.CertificateRequest{Subject: pkix.Name{CommonName: "frontend"}}, key)),
			reason: "csr_extra_name", ids: 1},
		{name: "another SPIFFE ID", csr: with(san(uri("spiffe://cluster.local/ns/prod/sa/backend"))), reason: "csr_identity_mismatch"},
		{name: "the URI and a DNS name", csr: with(san(uri(frontend.String()), dns("frontend.prod.svc"))), reason: "csr_extra_name"},
		{name: "a bad signature", csr: pemOf(badSig), reason: "csr_bad_signature"},
		{name: "a key the policy refuses", csr: pemOf(der(&x509.CertificateRequest{URIs: []*url.URL{frontend.URL()}}, weak)), reason: "csr_key_policy"},
		{name: "a bad token", csr: "hello", token: "who-knows", reason: "test_bad_token"},
		{name: "a TTL above the maximum", csr: frontendCSR(t), ttl: 100 * 24 * 3600, reason: "ttl_too_long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, root.Authority(), options{})
			token := tt.token
			if token == "" {
				token = "frontend-token"
			}
			in := &authpb.IstioCertificateRequest{Csr: tt.csr, ValidityDuration: tt.ttl}
			_, _ = f.srv.CreateCertificate(inProcess(context.Background(), "192.0.2.1:5000", token), in)
			for _, m := range []struct {
				name   string
				labels map[string]string
				want   float64
			}{
				{"meshca_requests_total", map[string]string{"reason": tt.reason}, 1},
				{"citadel_server_csr_parsing_err_count", nil, tt.parse},
				{"citadel_server_id_extraction_err_count", nil, tt.ids},
			} {
				wantSample(t, f.reg, m.name, m.labels, m.want)
			}
		})
	}
}
