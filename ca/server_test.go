package ca_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/local"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// tokens is a pure in-memory authenticator for these unit tests; the
// TokenReview path runs against a real apiserver in integration/.
type tokens map[string]*ca.Caller

func (m tokens) Authenticate(_ context.Context, c *ca.Credentials) (*ca.Caller, error) {
	if c.Token == "" {
		return nil, ca.ErrNoCredentials
	}
	if caller, ok := m[c.Token]; ok {
		return caller, nil
	}
	return nil, &ca.Error{Code: codes.Unauthenticated, Reason: "test_bad_token", Msg: "bad token"}
}

type fixture struct {
	addr    string
	roots   *x509.CertPool
	reg     *prometheus.Registry
	logs    *syncBuffer
	auth    *keymgr.Authority
	tokDir  string
	manager *keymgr.Manager
	srv     *ca.Server
}

type options struct {
	signer signer.Signer
	maxTTL time.Duration
	// authn, when set, is the cluster's first authenticator.
	authn ca.Authenticator
	// config, when set, changes the server's configuration.
	config func(*ca.Config)
	// register, when set, adds services to the gRPC server before it
	// serves.
	register func(*grpc.Server)
	// guard, when set, admits the connections (its listener and stats
	// handler).
	guard *limit.ConnGuard
}

func newFixture(t *testing.T, a *keymgr.Authority, o options) *fixture {
	t.Helper()
	mgr := keymgr.NewManager(td, a)
	if o.signer == nil {
		o.signer = local.New(local.Config{Authorities: mgr})
	}
	reg := prometheus.NewRegistry()
	logs := &syncBuffer{}
	auths := []ca.Authenticator{tokens{"frontend-token": {ID: frontend, Namespace: "prod", ServiceAccount: "frontend", Method: "token"}}}
	if o.authn != nil {
		auths = append([]ca.Authenticator{o.authn}, auths...)
	}
	cfg := ca.Config{
		TrustDomain:    td,
		Authenticators: []ca.Authenticator{&ca.CertAuthenticator{TrustDomain: td, Bundles: mgr}},
		Clusters: ca.NewClusterSet(&ca.Cluster{
			ID:             "Kubernetes",
			Authenticators: auths,
			Authorizer:     &ca.NodeAuthorizer{TrustDomain: td},
		}),
		Signer:     o.signer,
		SignerName: "local",
		Bundles:    mgr,
		MaxTTL:     o.maxTTL,
		Metrics:    ca.NewMetrics(reg, expiry{mgr}, nil),
		Logger:     slog.New(slog.NewJSONHandler(logs, nil)),
	}
	if o.config != nil {
		o.config(&cfg)
	}
	srv, err := ca.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := keymgr.IssueServing(a, keymgr.ServingOptions{Names: []string{"istiod.istio-system.svc"}})
	if err != nil {
		t.Fatal(err)
	}
	var gopts []grpc.ServerOption
	if o.guard != nil {
		gopts = append(gopts, ca.GuardOptions(o.guard)...)
	}
	g := ca.NewGRPCServer(srv, ca.TLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serving, nil }, td, mgr), gopts...)
	if o.register != nil {
		o.register(g)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if o.guard != nil {
		lis = o.guard.Listener(lis)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	pool := x509.NewCertPool()
	for _, r := range a.Roots {
		pool.AddCert(r)
	}
	dir := t.TempDir()
	for name, tok := range map[string]string{"good": "frontend-token", "bad": "who-knows"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return &fixture{addr: lis.Addr().String(), roots: pool, reg: reg, logs: logs, auth: a, tokDir: dir, manager: mgr, srv: srv}
}

type expiry struct{ m *keymgr.Manager }

func (e expiry) RootNotAfter() time.Time  { return e.m.Authority().Roots[0].NotAfter }
func (e expiry) ChainNotAfter() time.Time { return e.m.Authority().NotAfter() }

func (f *fixture) client(t *testing.T, token string, cert *tls.Certificate) *caclient.Client {
	t.Helper()
	cfg := caclient.Config{Addr: f.addr, ServerName: "istiod.istio-system.svc", Roots: f.roots, ClusterID: "Kubernetes", Certificate: cert}
	if token != "" {
		cfg.TokenFile = filepath.Join(f.tokDir, token)
	}
	c, err := caclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var frontend = spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/frontend")

func TestIssueWithToken(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	f := newFixture(t, root.Authority(), options{})
	svid, err := f.client(t, "good", nil).Fetch(context.Background(), frontend, caclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	leaf := svid.Chain[0]
	if got := leaf.NotAfter.Sub(leaf.NotBefore); got < 24*time.Hour || got > 24*time.Hour+3*time.Minute {
		t.Errorf("validity %v, want 24h plus the backdate", got)
	}
	if metricValue(t, f.reg, "citadel_server_success_cert_issuance_count") != 1 {
		t.Error("issuance not counted")
	}
	logs := f.logs.String()
	for _, want := range []string{`"audit":true`, `"code":"OK"`, `"identity":"spiffe://cluster.local/ns/prod/sa/frontend"`, `"serial":`} {
		if !strings.Contains(logs, want) {
			t.Errorf("audit log lacks %s: %s", want, logs)
		}
	}
	if strings.Contains(logs, "frontend-token") {
		t.Error("the token leaked into the log")
	}
}

func metricValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

func TestRefusals(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	f := newFixture(t, root.Authority(), options{maxTTL: 48 * time.Hour})
	other := spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/backend")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csrFor := func(id spiffeid.ID) string {
		p, err := csr.Build(key, id)
		if err != nil {
			t.Fatal(err)
		}
		return string(p)
	}
	tests := []struct {
		name    string
		token   string
		csr     string
		opts    caclient.Options
		code    codes.Code
		msg     string
		reason  string
		cluster string
	}{
		{name: "no credentials", csr: csrFor(frontend), code: codes.Unauthenticated, msg: "no credentials", reason: "no_credentials"},
		{name: "bad token", token: "bad", csr: csrFor(frontend), code: codes.Unauthenticated, msg: "bad token", reason: "test_bad_token"},
		{name: "other identity", token: "good", csr: csrFor(other), code: codes.InvalidArgument, msg: "may only receive spiffe://cluster.local/ns/prod/sa/frontend", reason: "csr_identity_mismatch"},
		{name: "garbage csr", token: "good", csr: "hello", code: codes.InvalidArgument, msg: "invalid CSR: no PEM block", reason: "csr_malformed"},
		{name: "ttl too long", token: "good", csr: csrFor(frontend), opts: caclient.Options{TTL: 72 * time.Hour}, code: codes.InvalidArgument, msg: "above the maximum", reason: "ttl_too_long"},
		{name: "impersonation", token: "good", csr: csrFor(other), opts: caclient.Options{Impersonate: true}, code: codes.PermissionDenied, msg: "may not request other identities", reason: "untrusted_caller"},
		{name: "unknown cluster", token: "good", csr: csrFor(frontend), cluster: "elsewhere", code: codes.Unauthenticated, msg: `unknown cluster "elsewhere"`, reason: "unknown_cluster"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := f.client(t, tt.token, nil)
			if tt.cluster != "" {
				cfg := caclient.Config{Addr: f.addr, ServerName: "istiod.istio-system.svc", Roots: f.roots, ClusterID: tt.cluster, TokenFile: filepath.Join(f.tokDir, tt.token)}
				c, _ = caclient.New(cfg)
				defer c.Close()
			}
			id := frontend
			if tt.opts.Impersonate {
				id = other
			}
			_, err := c.Call(context.Background(), tt.csr, id, tt.opts)
			st, _ := status.FromError(err)
			if st.Code() != tt.code || !strings.Contains(st.Message(), tt.msg) {
				t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), tt.code, tt.msg)
			}
			if !strings.Contains(f.logs.String(), `"reason":"`+tt.reason+`"`) {
				t.Errorf("log lacks reason %s", tt.reason)
			}
		})
	}
}

func TestRenewalWithClientCertificate(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	f := newFixture(t, root.Authority(), options{})
	first, err := f.client(t, "good", nil).Fetch(context.Background(), frontend, caclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	second, err := f.client(t, "", first.TLSCertificate()).Fetch(context.Background(), frontend, caclient.Options{})
	if err != nil {
		t.Fatalf("renewal with the SVID and no token: %v", err)
	}
	if second.Chain[0].SerialNumber.Cmp(first.Chain[0].SerialNumber) == 0 {
		t.Fatal("renewal returned the same certificate")
	}
	_, err = f.client(t, "", first.TLSCertificate()).Fetch(context.Background(), spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/admin"), caclient.Options{})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("renewal for another identity: %v, want InvalidArgument", err)
	}
}

// TestChainLayout: leaf, the intermediate, then every root in one element
// (two during a rotation), and never a root among the intermediates.
func TestChainLayout(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	next := testca.NewRoot(t, "next root", testca.Options{})
	inter := root.NewIntermediate(t, "intermediate", testca.Options{})
	f := newFixture(t, inter.Authority(root.Cert, next.Cert), options{})
	c := f.client(t, "good", nil)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p, _ := csr.Build(key, frontend)
	chain, err := c.Call(context.Background(), string(p), frontend, caclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 3 {
		t.Fatalf("chain has %d elements, want leaf, intermediate, bundle", len(chain))
	}
	mid, err := pemutil.ParseCertificates([]byte(chain[1]))
	if err != nil || len(mid) != 1 || !mid[0].Equal(inter.Cert) {
		t.Fatalf("element 1 is not the intermediate: %v", err)
	}
	roots, err := pemutil.ParseCertificates([]byte(chain[2]))
	if err != nil || len(roots) != 2 || !roots[0].Equal(root.Cert) || !roots[1].Equal(next.Cert) {
		t.Fatalf("last element holds %d roots, want both: %v", len(roots), err)
	}
	if _, err := caclient.Check(chain, frontend, key); err != nil {
		t.Fatal(err)
	}
}

type failingSigner struct{ kind signer.Kind }

func (s failingSigner) Sign(context.Context, *signer.Request) (*signer.Response, error) {
	return nil, signer.Errorf("test", s.kind, "backend says no")
}

// timeoutSigner's backend did not answer before the request's deadline.
type timeoutSigner struct{}

func (timeoutSigner) Sign(context.Context, *signer.Request) (*signer.Response, error) {
	return nil, &signer.Error{Backend: "test", Kind: signer.KindUnavailable, Err: fmt.Errorf("backend says no: %w", context.DeadlineExceeded)}
}

// wrongSigner issues for an identity other than the authorized one.
type wrongSigner struct{ inner signer.Signer }

func (s wrongSigner) Sign(ctx context.Context, r *signer.Request) (*signer.Response, error) {
	r2 := *r
	r2.ID = spiffeid.RequireFromString("spiffe://cluster.local/ns/kube-system/sa/admin")
	return s.inner.Sign(ctx, &r2)
}

func TestSignerFailures(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	mgr := keymgr.NewManager(td, root.Authority())
	ending := root.NewIntermediate(t, "ending intermediate", testca.Options{NotAfter: time.Now().Add(30 * time.Second).Truncate(time.Second)})
	endingSigner := local.New(local.Config{Authorities: keymgr.NewManager(td, ending.Authority()),
		Renewal: func() (string, error) { return "upstream self failing since 10:00", errors.New("backend says no") }})
	tests := []struct {
		name   string
		signer signer.Signer
		code   codes.Code
		msg    string
	}{
		{"unavailable", failingSigner{signer.KindUnavailable}, codes.Unavailable, "signing backend unavailable, retry later"},
		{"refused", failingSigner{signer.KindRefused}, codes.FailedPrecondition, "signing backend refused the request; the CA operator must check its configuration"},
		{"internal", failingSigner{signer.KindInternal}, codes.Internal, "signing failed"},
		{"out of time", timeoutSigner{}, codes.Unavailable, "signing backend did not answer in time, retry later"},
		{"wrong identity", wrongSigner{local.New(local.Config{Authorities: mgr})}, codes.Internal, ""},
		{"intermediate ending", endingSigner, codes.Unavailable, "the CA's signing certificate ends at " + ending.Cert.NotAfter.UTC().Format(time.RFC3339) +
			", too soon to issue a certificate; it is renewed from its upstream, retry later (upstream self failing since 10:00)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, root.Authority(), options{signer: tt.signer})
			_, err := f.client(t, "good", nil).Fetch(context.Background(), frontend, caclient.Options{})
			if status.Code(err) != tt.code || tt.msg != "" && status.Convert(err).Message() != tt.msg {
				t.Fatalf("err = %v, want %v %q", err, tt.code, tt.msg)
			}
			if strings.Contains(status.Convert(err).Message(), "backend says no") {
				t.Error("backend detail leaked to the client")
			}
		})
	}
}
