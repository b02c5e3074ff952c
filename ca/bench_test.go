package ca_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"io"
	"log/slog"
	"testing"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/benchbase"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/meshca/meshca/signer/local"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/metadata"
)

// BenchmarkCreateCertificate is the whole request path in process (header
// parsing, authentication by an in-memory token table, CSR parse and
// policy, signing, verification of the issued chain, response, audit and
// metrics), without the network or TokenReview. x-rawsign is its cost over
// one raw certificate issuance (benchbase.RawSign) measured in the same run;
// x-rawissue over the raw work of a request (benchbase.NewRawIssuance: the
// CSR decoded, parsed and verified too), the baseline of make bench-load.
func BenchmarkCreateCertificate(b *testing.B) {
	root := testca.NewRoot(b, "bench root", testca.Options{})
	mgr := keymgr.NewManager(td, root.Authority())
	srv, err := ca.New(ca.Config{
		TrustDomain: td,
		Clusters: ca.NewClusterSet(&ca.Cluster{
			ID:             "Kubernetes",
			Authenticators: []ca.Authenticator{tokens{"t": {ID: frontend, Namespace: "prod", ServiceAccount: "frontend", Method: "token"}}},
			Authorizer:     &ca.NodeAuthorizer{TrustDomain: td},
		}),
		Signer:  local.New(local.Config{Authorities: mgr}),
		Bundles: mgr,
		// The cost of a request, not the caller's budget.
		Limits:  limit.Limits{Caller: limit.Budget{Rate: limit.NoLimit, MaxInFlight: limit.NoLimit}},
		Metrics: ca.NewMetrics(prometheus.NewRegistry(), expiry{mgr}, nil),
		Logger:  slog.New(slog.NewJSONHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pemCSR, err := csr.Build(key, frontend)
	if err != nil {
		b.Fatal(err)
	}
	req := &authpb.IstioCertificateRequest{Csr: string(pemCSR), ValidityDuration: 86400}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer t", "clusterid", "Kubernetes"))
	baseline := benchbase.RawSign()
	issue := benchbase.NsPerOp(benchbase.NewRawIssuance([][]byte{pemCSR}))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if _, err := srv.CreateCertificate(ctx, req); err != nil {
			b.Fatal(err)
		}
		n++
	}
	benchbase.Report(b, n, baseline, "rawsign")
	benchbase.Report(b, n, issue, "rawissue")
}
