package serve

import (
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/trust/bundleendpoint"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

// saToken is an unsigned JWT with claims, as the apiserver's tokens are
// shaped.
func saToken(t *testing.T, claims map[string]any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(payload) + ".c2ln"
}

func boundClaims(ns, sa string) map[string]any {
	return map[string]any{"sub": "system:serviceaccount:" + ns + ":" + sa,
		"kubernetes.io": map[string]any{"namespace": ns, "serviceaccount": map[string]any{"name": sa, "uid": "u"}}}
}

// TestOwnAccount: meshca's own account is the service account of its
// credentials' bearer token (in a Pod, the mounted one; out of cluster, a
// kubeconfig's token or tokenFile); credentials of no service account
// name none; a token file that cannot be read is an error.
func TestOwnAccount(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte(saToken(t, boundClaims("mesh", "ca"))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  rest.Config
		want string
		err  string
	}{
		{name: "a bound service-account token", cfg: rest.Config{BearerToken: saToken(t, boundClaims("istio-system", "meshca"))}, want: "istio-system/meshca"},
		{name: "a token file, as in a Pod", cfg: rest.Config{BearerTokenFile: file}, want: "mesh/ca"},
		{name: "a client certificate", cfg: rest.Config{TLSClientConfig: rest.TLSClientConfig{CertFile: "admin.crt"}}},
		{name: "an opaque token", cfg: rest.Config{BearerToken: "t"}},
		{name: "a user's OIDC token", cfg: rest.Config{BearerToken: saToken(t, map[string]any{"sub": "alice", "iss": "https://idp.example"})}},
		{name: "a token file gone", cfg: rest.Config{BearerTokenFile: filepath.Join(dir, "gone")}, err: "meshca's own service account: open "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			deny, err := denyOwnAccount(nil, &tt.cfg, slog.New(slog.DiscardHandler))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			var want []string
			if tt.want != "" {
				want = []string{tt.want}
			}
			if got := deny.Own(); err != nil || !slices.Equal(got, want) {
				t.Fatalf("own %q, err %v; want %q", got, err, want)
			}
		})
	}
}

// TestClustersDenyOwnAccount: the clusters' authorizers deny meshca's own
// account, learnt from the local cluster's credentials, besides the
// operator's entries, which stay as given.
func TestClustersDenyOwnAccount(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	kc := "apiVersion: v1\nkind: Config\nclusters: [{name: l, cluster: {server: https://127.0.0.1:1}}]\n" +
		"users: [{name: l, user: {token: " + saToken(t, boundClaims("istio-system", "meshca")) + "}}]\n" +
		"contexts: [{name: l, context: {cluster: l, user: l}}]\ncurrent-context: l\n"
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	deny, err := ca.ParseNodeProxyDeny([]string{"kube-system"})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := newClusters(Clusters{LocalID: ca.DefaultClusterID, LocalKubeconfig: kubeconfig, NodeProxyDeny: deny,
		NewClient: func(*rest.Config) (kubernetes.Interface, error) { return fake.NewClientset(), nil }},
		spiffeid.RequireTrustDomainFromString("cluster.local"), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	local, _ := cl.set.Cluster("")
	got := local.Authorizer.NodeProxyDeny
	if !slices.Equal(got.Own(), []string{"istio-system/meshca"}) || !slices.Equal(got.Entries(), []string{"kube-system"}) {
		t.Fatalf("own %q, entries %q; want istio-system/meshca, kube-system", got.Own(), got.Entries())
	}
}

// TestDenyEndpointID: the bundle endpoint's SPIFFE ID under https_spiffe
// is one of meshca's own identities when it names a workload's account;
// an ID of another shape, which no node proxy can ask for, and https_web
// add nothing.
func TestDenyEndpointID(t *testing.T) {
	plan := func(profile, id string) *bundlePlan {
		p := &bundlePlan{profile: profile}
		if id != "" {
			p.c.ID = spiffeid.RequireFromString(id)
		}
		return p
	}
	tests := []struct {
		name string
		plan *bundlePlan
		want []string
	}{
		{"https_spiffe, a workload's ID", plan(bundleendpoint.ProfileSPIFFE, "spiffe://cluster.local/ns/mesh/sa/meshca"), []string{"mesh/meshca"}},
		{"https_spiffe, another shape", plan(bundleendpoint.ProfileSPIFFE, "spiffe://cluster.local/meshca/bundle"), nil},
		{"https_web", plan(bundleendpoint.ProfileWeb, ""), nil},
		{"no endpoint", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			deny, err := denyEndpointID(nil, tt.plan)
			if err != nil || !slices.Equal(deny.Own(), tt.want) {
				t.Fatalf("own %q, %v; want %q", deny.Own(), err, tt.want)
			}
		})
	}
}
