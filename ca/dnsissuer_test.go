package ca_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/local"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// dnsNamesSigner signs for other names than asked.
type dnsNamesSigner struct {
	inner signer.Signer
	names []string
}

func (s dnsNamesSigner) Sign(ctx context.Context, r *signer.Request) (*signer.Response, error) {
	r2 := *r
	r2.DNSNames = s.names
	return s.inner.Sign(ctx, &r2)
}

// TestDNSIssuer: istiod's certificate passes the server's key policy,
// CheckDNS, the signer and a chain verification for each name, and every
// answer is audited once, with the serial of what was issued.
func TestDNSIssuer(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	names := []string{"istiod.istio-system.svc"}
	root := testca.NewRoot(t, "root", testca.Options{})
	inter := root.NewIntermediate(t, "issuing", testca.Options{})
	mgr := keymgr.NewManager(td, inter.Authority())
	other := keymgr.NewManager(td, testca.NewRoot(t, "another root", testca.Options{}).Authority())
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	tests := []struct {
		name   string
		signer signer.Signer
		key    crypto.Signer
		csrFor []string // the names the CSR asks for; names when nil
		reason string   // audited; "" when issued
		msg    string
	}{
		{name: "issued, EC", signer: local.New(local.Config{Authorities: mgr}), key: p256},
		{name: "issued, RSA", signer: local.New(local.Config{Authorities: mgr}), key: rsaKey},
		{name: "weak key", signer: local.New(local.Config{Authorities: mgr}), key: p224, reason: "csr_key_policy", msg: "P-224"},
		{name: "CSR for other names", signer: local.New(local.Config{Authorities: mgr}), key: p256, csrFor: []string{"kubernetes.default.svc"},
			reason: "csr_identity_mismatch", msg: `"kubernetes.default.svc"`},
		{name: "backend issues other names", signer: dnsNamesSigner{local.New(local.Config{Authorities: mgr}), []string{"evil.example"}}, key: p256,
			reason: "issued_chain_invalid", msg: "for istiod.istio-system.svc"},
		{name: "another root", signer: local.New(local.Config{Authorities: other}), key: p256, reason: "issued_chain_invalid", msg: "unknown authority"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			audit := &podAudit{}
			srv, err := ca.New(ca.Config{TrustDomain: td, Clusters: ca.NewClusterSet(&ca.Cluster{ID: "Kubernetes"}),
				Signer: tt.signer, SignerName: "local", Bundles: mgr, Audit: audit,
				Metrics: ca.NewMetrics(prometheus.NewRegistry(), podExpiry{mgr}, nil), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			csrFor := tt.csrFor
			if csrFor == nil {
				csrFor = names
			}
			req, err := csr.BuildDNS(tt.key, csrFor)
			if err != nil {
				t.Fatal(err)
			}
			out, err := ca.NewDNSIssuer(srv).IssueDNS(context.Background(),
				&istiodcert.IssueRequest{Secret: "istio-system/istiod-tls", CSR: req, DNSNames: names, TTL: time.Hour})
			if len(audit.events) != 1 {
				t.Fatalf("%d audit events, want 1", len(audit.events))
			}
			e := audit.events[0]
			if e.Event != ca.EventIstiodCertificate || e.RequestID != "istio-system/istiod-tls" || e.Identity != names[0] {
				t.Fatalf("audit event %+v", e)
			}
			if tt.reason == "" {
				switch {
				case err != nil:
					t.Fatalf("IssueDNS: %v", err)
				case e.Decision != ca.DecisionIssued || e.Serial != out.Leaf.SerialNumber.Text(16):
					t.Fatalf("audit event %+v, want issued with serial %s", e, out.Leaf.SerialNumber.Text(16))
				case len(out.Intermediates) != 1 || len(out.Roots) != 1 || !out.Roots[0].Equal(root.Cert):
					t.Fatalf("issued with %d intermediates and %d roots", len(out.Intermediates), len(out.Roots))
				}
				return
			}
			if err == nil || e.Decision != ca.DecisionDenied || e.Reason != tt.reason || !strings.Contains(e.Detail, tt.msg) {
				t.Fatalf("IssueDNS = %v; audit %s/%s %q, want denied %s with %q", err, e.Decision, e.Reason, e.Detail, tt.reason, tt.msg)
			}
		})
	}
}
