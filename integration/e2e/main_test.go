// Package e2e runs meshca as a process against a real etcd and
// kube-apiserver and talks to it with a real gRPC client.
package e2e

import (
	"crypto/x509"
	"os"
	"testing"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
)

var (
	cluster *harness.Cluster
	bin     string
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, func(c *harness.Cluster, meshca string) { cluster, bin = c, meshca }))
}

// server is one meshca with a self-signed root in a fresh state directory.
type server struct {
	*harness.Meshca
	stateDir string
	roots    *x509.CertPool
	rootsPEM []byte
}

func startServer(t testing.TB, extra ...string) *server {
	t.Helper()
	return startServerAs(t, cluster.Kubeconfig, extra...)
}

// startServerAs runs meshca with the given kubeconfig's credentials.
func startServerAs(t testing.TB, kubeconfig string, extra ...string) *server {
	t.Helper()
	m := harness.StartSelfSigned(t, bin, kubeconfig, extra...)
	return &server{Meshca: m.Meshca, stateDir: m.StateDir, roots: m.Roots, rootsPEM: m.RootsPEM}
}

func (s *server) client(t testing.TB, token string) *checked.Client {
	t.Helper()
	cfg := caclient.Config{Addr: s.Addr, ServerName: "istiod.istio-system.svc", Roots: s.roots, ClusterID: "Kubernetes"}
	if token != "" {
		cfg.TokenFile = harness.WriteToken(t, token)
	}
	c, err := checked.NewClient(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
