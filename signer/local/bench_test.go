package local_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/benchbase"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer/local"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// BenchmarkBaselineRawSign is x509.CreateCertificate of a workload leaf by
// a P-256 CA: the floor any signer pays.
func BenchmarkBaselineRawSign(b *testing.B) {
	sign := benchbase.NewRawSign()
	b.ReportAllocs()
	for b.Loop() {
		sign()
	}
}

// BenchmarkSign is the built-in signer issuing for ztunnel's CSR. x-rawsign
// is its cost over BenchmarkBaselineRawSign's, measured in the same run.
func BenchmarkSign(b *testing.B) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	root := testca.NewRoot(b, "bench root", testca.Options{})
	s := local.New(local.Config{Authorities: keymgr.NewManager(td, root.Authority())})
	id := spiffeid.RequireFromSegments(td, "ns", "default", "sa", "bench")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	req := signertest.NewRequest(b, id, key, 24*time.Hour)
	baseline := benchbase.RawSign()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if _, err := s.Sign(context.Background(), req); err != nil {
			b.Fatal(err)
		}
		n++
	}
	benchbase.Report(b, n, baseline, "rawsign")
}
