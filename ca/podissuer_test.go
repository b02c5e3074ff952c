package ca_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/ca/podcert"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/local"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podAudit keeps the audit events.
type podAudit struct {
	mu     sync.Mutex
	events []*ca.AuditEvent
}

func (a *podAudit) Audit(_ context.Context, e *ca.AuditEvent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, e)
}

// podExpiry is the manager's expiry, for the metrics.
type podExpiry struct{ m *keymgr.Manager }

func (e podExpiry) RootNotAfter() time.Time  { return e.m.Authority().Roots[0].NotAfter }
func (e podExpiry) ChainNotAfter() time.Time { return e.m.Authority().NotAfter() }

// podIdentitySigner signs for id, whatever was asked.
type podIdentitySigner struct {
	inner signer.Signer
	id    spiffeid.ID
}

func (s podIdentitySigner) Sign(ctx context.Context, r *signer.Request) (*signer.Response, error) {
	r2 := *r
	r2.ID = s.id
	return s.inner.Sign(ctx, &r2)
}

// podStub is a stub CSR made from tmpl with a new P-256 key; the
// kubelet's template is empty.
func podStub(t *testing.T, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	stub, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return stub
}

// TestPodIssuerSignedButRefused: a certificate the backend signed but the
// CA does not hand out is returned in a *podcert.SignedError, and its
// decision is audited failed with its serial, as the gRPC path audits
// it.
func TestPodIssuerSignedButRefused(t *testing.T) {
	podTD := spiffeid.RequireTrustDomainFromString("cluster.local")
	web := spiffeid.RequireFromPath(podTD, "/ns/shop/sa/web")
	root := testca.NewRoot(t, "root", testca.Options{})
	mgr := keymgr.NewManager(podTD, root.Authority())
	other := keymgr.NewManager(podTD, testca.NewRoot(t, "another root", testca.Options{}).Authority())
	tests := []struct {
		name    string
		signer  signer.Signer
		bundles x509bundle.Source
		reason  string // of the SignedError; "" when issued
		kind    signer.Kind
		msg     string
	}{
		{name: "verified", signer: local.New(local.Config{Authorities: mgr})},
		{name: "wrong identity", signer: podIdentitySigner{local.New(local.Config{Authorities: mgr}), spiffeid.RequireFromPath(podTD, "/ns/kube-system/sa/admin")},
			reason: "issued_wrong_identity", kind: signer.KindInternal,
			msg: "ca: issued certificate failed verification: issued spiffe://cluster.local/ns/kube-system/sa/admin, authorized spiffe://cluster.local/ns/shop/sa/web"},
		{name: "another root", signer: local.New(local.Config{Authorities: other}), reason: "issued_chain_invalid", kind: signer.KindInternal,
			msg: "ca: issued certificate failed verification: "},
		{name: "no trust bundle", signer: local.New(local.Config{Authorities: mgr}), bundles: x509bundle.NewSet(),
			reason: "no_trust_bundle", kind: signer.KindUnavailable, msg: "signer local: unavailable: no trust bundle yet: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			audit := &podAudit{}
			bundles := tt.bundles
			if bundles == nil {
				bundles = mgr
			}
			srv, err := ca.New(ca.Config{TrustDomain: podTD, Clusters: ca.NewClusterSet(&ca.Cluster{ID: "Kubernetes"}),
				Signer: tt.signer, SignerName: "local", Bundles: bundles, Audit: audit,
				Metrics: ca.NewMetrics(prometheus.NewRegistry(), podExpiry{mgr}, nil), Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			stub := podStub(t, &x509.CertificateRequest{})
			p := ca.NewPodIssuer(srv, prometheus.NewRegistry())
			iss, err := p.IssuePod(context.Background(), &podcert.IssueRequest{StubPKCS10: stub, ID: web, Lifetime: time.Hour})
			if tt.reason == "" {
				if err != nil || iss.Leaf == nil {
					t.Fatalf("IssuePod = %v, %v", iss, err)
				}
				return
			}
			var se *podcert.SignedError
			if !errors.As(err, &se) || se.Leaf == nil || se.Reason != tt.reason || signer.KindOf(err) != tt.kind || !strings.HasPrefix(err.Error(), tt.msg) {
				t.Fatalf("IssuePod error %v (%#v), want a SignedError with a leaf, reason %s, kind %s, %q", err, se, tt.reason, tt.kind, tt.msg)
			}
			r := &certv1.PodCertificateRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1-abc"},
				Spec: certv1.PodCertificateRequestSpec{SignerName: "meshca.io/svid", PodName: "web-1", NodeName: "node-a"}}
			p.RecordPod(context.Background(), &podcert.Decision{Request: r, Identity: web, Condition: certv1.PodCertificateRequestConditionTypeFailed,
				Reason: se.Reason, Detail: err.Error(), Leaf: se.Leaf})
			if len(audit.events) != 1 {
				t.Fatalf("%d audit events, want 1", len(audit.events))
			}
			e := audit.events[0]
			if e.Event != ca.EventPodCertificate || e.Decision != ca.DecisionFailed || e.Reason != tt.reason ||
				e.Serial != se.Leaf.SerialNumber.Text(16) || !e.NotAfter.Equal(se.Leaf.NotAfter) || e.Detail != err.Error() {
				t.Fatalf("audit event %+v: want failed, %s, serial %s", e, tt.reason, se.Leaf.SerialNumber.Text(16))
			}
		})
	}
}

// TestPodIssuerBudgets: a kubelet's PodCertificateRequests spend its
// node's turn of the node proxy budget and an issuance slot, as a
// ztunnel's requests do; over either, IssuePod says when to retry with a
// *podcert.Busy, signs nothing, and counts it.
func TestPodIssuerBudgets(t *testing.T) {
	podTD := spiffeid.RequireTrustDomainFromString("cluster.local")
	web := spiffeid.RequireFromPath(podTD, "/ns/shop/sa/web")
	mgr := keymgr.NewManager(podTD, testca.NewRoot(t, "root", testca.Options{}).Authority())
	stub := podStub(t, &x509.CertificateRequest{})
	newIssuer := func(t *testing.T, s signer.Signer, maxInFlight int, limits limit.Limits) (*ca.PodIssuer, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		srv, err := ca.New(ca.Config{TrustDomain: podTD, Clusters: ca.NewClusterSet(&ca.Cluster{ID: "Kubernetes"}),
			Signer: s, SignerName: "local", Bundles: mgr, Audit: &podAudit{}, MaxInFlight: maxInFlight, Limits: limits,
			Metrics: ca.NewMetrics(reg, podExpiry{mgr}, nil), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return ca.NewPodIssuer(srv, prometheus.NewRegistry()), reg
	}
	issue := func(p *ca.PodIssuer, node string) error {
		_, err := p.IssuePod(context.Background(), &podcert.IssueRequest{StubPKCS10: stub, ID: web, Lifetime: time.Hour, Node: node})
		return err
	}
	wantBusy := func(t *testing.T, err error, reason string, reg *prometheus.Registry) {
		t.Helper()
		var busy *podcert.Busy
		if !errors.As(err, &busy) || busy.Reason != reason || busy.RetryAfter <= 0 {
			t.Fatalf("IssuePod error %v, want a *podcert.Busy for %s with a retry hint", err, reason)
		}
		wantSample(t, reg, "meshca_rate_limited_total", map[string]string{"reason": reason}, 1)
	}

	t.Run("node rate", func(t *testing.T) {
		p, reg := newIssuer(t, local.New(local.Config{Authorities: mgr}), 0,
			limit.Limits{NodeProxy: limit.Budget{Rate: 0.001, Burst: 2, MaxInFlight: 8}})
		for i := range 2 {
			if err := issue(p, "node-a"); err != nil {
				t.Fatalf("request %d of node-a, within its burst: %v", i+1, err)
			}
		}
		wantBusy(t, issue(p, "node-a"), "node_proxy_rate", reg)
		if err := issue(p, "node-b"); err != nil {
			t.Fatalf("node-b, with a budget of its own: %v", err)
		}
	})
	t.Run("issuance slots", func(t *testing.T) {
		bs := &blockingSigner{started: make(chan struct{}, 1), release: make(chan struct{})}
		// One token a node: the refusal for the slot must not spend
		// node-b's.
		p, reg := newIssuer(t, bs, 1, limit.Limits{NodeProxy: limit.Budget{Rate: 0.001, Burst: 1, MaxInFlight: 8}})
		done := make(chan error, 1)
		go func() { done <- issue(p, "node-a") }()
		<-bs.started
		wantBusy(t, issue(p, "node-b"), "too_many_requests", reg)
		close(bs.release)
		<-done
		var busy *podcert.Busy
		if err := issue(p, "node-b"); errors.As(err, &busy) {
			t.Fatalf("once the slot is free: %v, want it signed (by the test's failing signer) with the token the refusal left", err)
		}
	})
}

// TestPodIssuerRefusesStubsWithNames: a stub that asks for more than its
// key is refused before the backend is called, with a *csr.Error that
// says what it asked for (podcert answers it Denied).
func TestPodIssuerRefusesStubsWithNames(t *testing.T) {
	podTD := spiffeid.RequireTrustDomainFromString("cluster.local")
	web := spiffeid.RequireFromPath(podTD, "/ns/shop/sa/web")
	mgr := keymgr.NewManager(podTD, testca.NewRoot(t, "root", testca.Options{}).Authority())
	bs := &blockingSigner{started: make(chan struct{}, 1), release: make(chan struct{})}
	close(bs.release)
	srv, err := ca.New(ca.Config{TrustDomain: podTD, Clusters: ca.NewClusterSet(&ca.Cluster{ID: "Kubernetes"}),
		Signer: bs, SignerName: "local", Bundles: mgr, Audit: &podAudit{},
		Metrics: ca.NewMetrics(prometheus.NewRegistry(), podExpiry{mgr}, nil), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p := ca.NewPodIssuer(srv, prometheus.NewRegistry())
	stub := podStub(t, &x509.CertificateRequest{DNSNames: []string{"web.shop.svc"}})
	_, err = p.IssuePod(context.Background(), &podcert.IssueRequest{StubPKCS10: stub, ID: web, Lifetime: time.Hour, Node: "node-a"})
	var ce *csr.Error
	if !errors.As(err, &ce) || ce.Reason != csr.ReasonExtension || !strings.Contains(ce.Detail, "it asks for extension 2.5.29.17 (subjectAltName)") {
		t.Fatalf("IssuePod = %v, want a csr.Error for the stub's subjectAltName", err)
	}
	if len(bs.started) != 0 {
		t.Fatal("the backend was called for a refused stub")
	}
}

// TestPodIssuerNodeBlocked: the kubelet of a node blocked by a
// revocation gets no Pod certificate (a *podcert.Refusal, Denied
// NodeBlocked, naming the block and how to lift it), before the backend
// is called; another node's is served, with the issuer to audit.
func TestPodIssuerNodeBlocked(t *testing.T) {
	podTD := spiffeid.RequireTrustDomainFromString("cluster.local")
	web := spiffeid.RequireFromPath(podTD, "/ns/shop/sa/web")
	root := testca.NewRoot(t, "root", testca.Options{})
	mgr := keymgr.NewManager(podTD, root.Authority())
	at := time.Date(2026, 12, 6, 23, 0, 0, 0, time.UTC)
	srv, err := ca.New(ca.Config{TrustDomain: podTD, Clusters: ca.NewClusterSet(&ca.Cluster{ID: "Kubernetes"}),
		Signer: local.New(local.Config{Authorities: mgr}), SignerName: "local", Bundles: mgr, Audit: &podAudit{},
		NodeBlocks: blocks{"node-a": {Node: "node-a", At: at}},
		Metrics:    ca.NewMetrics(prometheus.NewRegistry(), podExpiry{mgr}, nil), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p := ca.NewPodIssuer(srv, prometheus.NewRegistry())
	stub := podStub(t, &x509.CertificateRequest{})
	tests := []struct {
		node, msg string
	}{
		{node: "node-a", msg: "node node-a is blocked by a revocation since 2026-12-06T23:00:00Z; an operator lifts it with meshca revoke --node node-a --undo"},
		{node: "node-b"},
	}
	for _, tt := range tests {
		iss, err := p.IssuePod(context.Background(), &podcert.IssueRequest{StubPKCS10: stub, ID: web, Lifetime: time.Hour, Node: tt.node})
		var ref *podcert.Refusal
		switch {
		case tt.msg == "" && (err != nil || iss.Issuer != keymgr.Fingerprint(root.Cert)):
			t.Errorf("%s: %v, want it signed, by the root (issuer %.16s)", tt.node, err, keymgr.Fingerprint(root.Cert))
		case tt.msg != "" && (!errors.As(err, &ref) || ref.Condition != certv1.PodCertificateRequestConditionTypeDenied ||
			ref.Reason != podcert.ReasonNodeBlocked || ref.Word != "node_blocked" || ref.Message != tt.msg):
			t.Errorf("%s: %v, want Denied NodeBlocked %q", tt.node, err, tt.msg)
		}
	}
}
