package serve_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/dirstore"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
)

var (
	td  = spiffeid.RequireTrustDomainFromString("cluster.local")
	web = spiffeid.RequireFromString("spiffe://cluster.local/ns/shop/sa/web")
)

// token is what the fake apiserver's TokenReview accepts, as a bound
// token of Pod shop/web-1.
const token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ3ZWIifQ.c2ln"

// fakeCluster is a pure in-memory apiserver for the assembly's unit tests
// (the real one runs in integration/): one Pod, and a TokenReview that
// accepts token as that Pod's.
func fakeCluster(*rest.Config) (kubernetes.Interface, error) {
	c := fake.NewClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", UID: "uid-1"},
		Spec:       corev1.PodSpec{ServiceAccountName: "web", NodeName: "node-a"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	})
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
		if tr.Spec.Token == token {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences, User: authnv1.UserInfo{
				Username: "system:serviceaccount:shop:web", Groups: []string{"system:serviceaccounts"},
				Extra: map[string]authnv1.ExtraValue{
					"authentication.kubernetes.io/pod-name": {"web-1"}, "authentication.kubernetes.io/pod-uid": {"uid-1"},
				},
			}}
		} else {
			tr.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		return true, tr, nil
	})
	return c, nil
}

// config is a local-backend configuration over the fake cluster, on
// kernel-picked loopback ports.
func config(t *testing.T) serve.Config {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	kc := "apiVersion: v1\nkind: Config\nclusters: [{name: l, cluster: {server: https://127.0.0.1:1}}]\n" +
		"users: [{name: l, user: {token: t}}]\ncontexts: [{name: l, context: {cluster: l, user: l}}]\ncurrent-context: l\n"
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return serve.Config{
		TrustDomain: td, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", ServingNames: []string{"istiod.istio-system.svc"},
		DefaultTTL: time.Hour, MaxTTL: 24 * time.Hour, KeyPolicy: csr.DefaultKeyPolicy(), CertRenewal: true,
		Clusters: serve.Clusters{LocalID: ca.DefaultClusterID, LocalKubeconfig: kubeconfig, Audiences: []string{"istio-ca"},
			NodeAccounts: map[string]bool{ca.DefaultNodeAccount: true}, NewClient: fakeCluster},
		Backend: serve.Backend{StateDir: filepath.Join(dir, "state")},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// start assembles c and runs it until the test ends; Run must then return
// nil.
func start(t *testing.T, c serve.Config) *serve.Parts {
	t.Helper()
	p, err := serve.Assemble(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	})
	ready := "http://" + p.Addresses().Admin + "/readyz"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if r, err := http.Get(ready); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("not ready within 10s")
		}
	}
}

func client(t *testing.T, p *serve.Parts, c serve.Config, tok string, svid *caclient.SVID) *caclient.Client {
	t.Helper()
	st, _, err := (&dirstore.Store{Dir: c.Backend.StateDir}).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cfg := caclient.Config{Addr: p.Addresses().GRPC, ServerName: "istiod.istio-system.svc", Roots: certs.Pool(st.Bundle()...)}
	if tok != "" {
		cfg.TokenFile = filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(cfg.TokenFile, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if svid != nil {
		cfg.Certificate = svid.TLSCertificate()
	}
	cl, err := caclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// TestAssembleServes: the assembled parts serve the whole request path
// (TokenReview, the caller's Pod, CSR policy, the built-in CA) and the
// admin endpoints, and renewal by certificate follows CertRenewal.
func TestAssembleServes(t *testing.T) {
	c := config(t)
	p := start(t, c)
	svid, err := client(t, p, c, token, nil).Fetch(context.Background(), web, caclient.Options{})
	if err != nil {
		t.Fatalf("SVID through the assembled server: %v", err)
	}
	if _, err := client(t, p, c, "", svid).Fetch(context.Background(), web, caclient.Options{}); err != nil {
		t.Fatalf("renewal by certificate: %v", err)
	}
	_, err = client(t, p, c, "eyJhIjoxfQ.eyJiIjoxfQ.c2ln", nil).Fetch(context.Background(), web, caclient.Options{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a token the apiserver refuses: %v", err)
	}
	r, err := http.Get("http://" + p.Addresses().Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	const handledOK = `grpc_server_handled_total{grpc_code="OK",grpc_method="CreateCertificate",grpc_service="istio.v1.auth.IstioCertificateService",grpc_type="unary"} 2`
	for m, want := range map[string]bool{
		"citadel_server_success_cert_issuance_count 2":                   true,
		"meshca_tokenreview_cache_misses_total":                          true,
		"meshca_trust_bundle_sequence 1":                                 true,
		`meshca_ca_authorities{phase="active"} 1`:                        true,
		"meshca_remote_cluster_refused_total":                            false, // no Secret namespace watched
		handledOK:                                                        true,
		`meshca_sign_errors_total{backend="local",kind="unavailable"} 0`: true,
		`meshca_rate_limited_total{reason="too_many_requests"} 0`:        true,
		"meshca_leader":                                                  false, // no Lease campaigned for
		"meshca_vault_":                                                  false,
	} {
		if got := strings.Contains(string(body), m); got != want {
			t.Errorf("/metrics: %q present = %v, want %v", m, got, want)
		}
	}

	c2 := config(t)
	c2.CertRenewal = false
	c2.Backend.StateDir = c.Backend.StateDir
	p2 := start(t, c2)
	_, err = client(t, p2, c2, "", svid).Fetch(context.Background(), web, caclient.Options{})
	if st := status.Convert(err); st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), "no credentials") {
		t.Fatalf("renewal by certificate when turned off: %v", err)
	}
}

// TestAssembleHealthAndCertSigners: the CA's own port answers gRPC health checks
// without credentials, SERVING for the server and the CA service once
// /readyz is ready, and the CA's refusal of a CertSigner name not listed
// reaches the assembled server while a listed one is served.
func TestAssembleHealthAndCertSigners(t *testing.T) {
	c := config(t)
	c.CertSigners = []string{"clusterA"}
	p := start(t, c)
	conn, err := grpc.NewClient(p.Addresses().GRPC, grpc.WithTransportCredentials(credentials.NewTLS(
		// A kubelet's TLS probe verifies nothing either.
		&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, service := range []string{"", "istio.v1.auth.IstioCertificateService"} {
		var got healthpb.HealthCheckResponse_ServingStatus
		for deadline := time.Now().Add(5 * time.Second); got != healthpb.HealthCheckResponse_SERVING; time.Sleep(50 * time.Millisecond) {
			r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
			got = r.GetStatus()
			if time.Now().After(deadline) {
				t.Fatalf("health of %q: %v %v, want SERVING", service, got, err)
			}
		}
	}
	for signer, want := range map[string]codes.Code{"clusterA": codes.OK, "clusterB": codes.InvalidArgument} {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		pemCSR, err := csr.Build(key, web)
		if err != nil {
			t.Fatal(err)
		}
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
		_, err = authpb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &authpb.IstioCertificateRequest{Csr: string(pemCSR),
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"CertSigner": structpb.NewStringValue(signer)}}})
		if status.Code(err) != want {
			t.Errorf("CertSigner %q: %v, want %v", signer, err, want)
		}
	}
}

// TestAssembleRefusals: a configuration the assembly cannot use names the
// setting at fault.
func TestAssembleRefusals(t *testing.T) {
	anchors := func(t *testing.T) []*x509.Certificate {
		a, err := keymgr.NewRoot(keymgr.RootOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return a.Roots
	}
	tests := []struct {
		name   string
		mutate func(t *testing.T, c *serve.Config)
		field  string
	}{
		{name: "two CA sources", mutate: func(t *testing.T, c *serve.Config) { c.Backend.CADir = t.TempDir() }, field: "state-dir"},
		{name: "empty CA dir", mutate: func(t *testing.T, c *serve.Config) { c.Backend.StateDir, c.Backend.CADir = "", t.TempDir() }, field: "ca-dir"},
		{name: "external without anchors", mutate: func(_ *testing.T, c *serve.Config) { c.Backend = serve.Backend{External: &external{name: "vault"}} }, field: "trust-anchors"},
		{name: "external that cannot open", mutate: func(t *testing.T, c *serve.Config) {
			c.Backend = serve.Backend{External: &external{name: "cfssl", open: &serve.FieldError{Field: "cfssl-url", Err: errors.New("no URL")}},
				TrustAnchors: anchors(t)}
		}, field: "cfssl-url"},
		{name: "external holding no key, no serving certificate", mutate: func(t *testing.T, c *serve.Config) {
			c.Backend = serve.Backend{External: &external{name: "vault", issuer: testca.NewRoot(t, "vault", testca.Options{})}, TrustAnchors: anchors(t)}
		}, field: "serving-cert-file"},
		{name: "listen address taken", mutate: func(_ *testing.T, c *serve.Config) { c.Listen = "127.0.0.1:-1" }, field: "listen"},
		{name: "admin address bad", mutate: func(_ *testing.T, c *serve.Config) { c.AdminListen = "nowhere:x" }, field: "admin-listen"},
		{name: "kubeconfig missing", mutate: func(_ *testing.T, c *serve.Config) { c.Clusters.LocalKubeconfig = "/nonexistent/kubeconfig" }, field: "kubeconfig"},
		{name: "remote named like local", mutate: func(_ *testing.T, c *serve.Config) {
			c.Clusters.Remotes = map[string]string{ca.DefaultClusterID: c.Clusters.LocalKubeconfig}
		}, field: "remote-cluster"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config(t)
			tt.mutate(t, &c)
			_, err := serve.Assemble(context.Background(), c)
			if err == nil {
				t.Fatal("assembled")
			}
			var fe *serve.FieldError
			if got := errors.As(err, &fe); got != (tt.field != "") || (got && fe.Field != tt.field) {
				t.Fatalf("err = %v, want a FieldError for %q", err, tt.field)
			}
		})
	}
}
