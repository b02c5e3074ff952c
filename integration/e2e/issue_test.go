package e2e

import (
	"context"
	"crypto"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

func workloadID(w *harness.Workload) spiffeid.ID {
	return spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", w.Namespace, "sa", w.ServiceAccount)
}

// TestIssueWithBoundToken: a bound token of a real Pod gets an SVID that
// go-spiffe verifies against the bundle meshca publishes.
func TestIssueWithBoundToken(t *testing.T) {
	s := startServer(t)
	w := cluster.NewWorkload(t, cluster.Namespace(t, "issue"), "frontend", "node-a")
	id := workloadID(w)
	svid, err := s.client(t, w.Token).Fetch(context.Background(), id, caclient.Options{TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	roots, err := pemutil.ParseCertificates(s.rootsPEM)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := x509svid.Verify(svid.Chain, x509bundle.FromX509Authorities(id.TrustDomain(), roots))
	if err != nil || got != id {
		t.Fatalf("x509svid.Verify = %v, %v; want %s", got, err, id)
	}
	leaf := svid.Chain[0]
	if d := leaf.NotAfter.Sub(leaf.NotBefore); d < 24*time.Hour || d > 24*time.Hour+3*time.Minute {
		t.Errorf("validity %v, want 24h plus backdate", d)
	}
	if !s.WaitForLog(5*time.Second, `"audit":true`, `"code":"OK"`, `"pod":"`+w.Namespace+"/"+w.Pod+`"`) {
		t.Errorf("no audit event naming the pod:\n%s", s.Logs())
	}
	if strings.Contains(s.Logs(), w.Token) {
		t.Fatal("the token leaked into the log")
	}
}

// TestIssueCommand runs `meshca issue` as ztunnel would run against the CA
// and checks the files it writes.
func TestIssueCommand(t *testing.T) {
	s := startServer(t)
	w := cluster.NewWorkload(t, cluster.Namespace(t, "cli"), "reviews", "node-a")
	dir := t.TempDir()
	rootsFile := filepath.Join(dir, "ca-roots.pem")
	if err := os.WriteFile(rootsFile, s.rootsPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	cmd := exec.Command(bin, "issue", "--ca-addr", s.Addr, "--ca-roots", rootsFile, "--token-file", harness.WriteToken(t, w.Token), "--out", out)
	res, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("meshca issue: %v\n%s", err, res)
	}
	if !strings.Contains(string(res), "SPIFFE ID:  "+workloadID(w).String()) {
		t.Fatalf("output lacks the SPIFFE ID:\n%s", res)
	}
	fi, err := os.Stat(filepath.Join(out, caclient.FileKey))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key.pem: %v mode %v, want 0600", err, fi.Mode().Perm())
	}
	chain, err := os.ReadFile(filepath.Join(out, caclient.FileChain))
	if err != nil {
		t.Fatal(err)
	}
	if certs, err := pemutil.ParseCertificates(chain); err != nil || len(certs) != 1 {
		t.Fatalf("cert-chain.pem: %d certs, %v", len(certs), err)
	}
	roots, err := os.ReadFile(filepath.Join(out, caclient.FileRoots))
	if err != nil {
		t.Fatal(err)
	}
	harness.CheckReply(t, []string{string(chain), string(roots)})
}

// TestRenewalWithCertificate: a still-valid SVID renews itself without a
// token, as istio-agent does.
func TestRenewalWithCertificate(t *testing.T) {
	s := startServer(t)
	w := cluster.NewWorkload(t, cluster.Namespace(t, "renew"), "ratings", "node-a")
	id := workloadID(w)
	first, err := s.client(t, w.Token).Fetch(context.Background(), id, caclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := checked.NewClient(t, caclient.Config{Addr: s.Addr, ServerName: "istiod.istio-system.svc", Roots: s.roots, Certificate: first.TLSCertificate()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	second, err := c.Fetch(context.Background(), id, caclient.Options{})
	if err != nil {
		t.Fatalf("renewal without a token: %v", err)
	}
	if second.Chain[0].SerialNumber.Cmp(first.Chain[0].SerialNumber) == 0 {
		t.Fatal("renewal returned the old certificate")
	}
	if !s.WaitForLog(5*time.Second, `"authn":"certificate"`, `"code":"OK"`) {
		t.Error("renewal not audited as certificate-authenticated")
	}
}

// newCSR returns a CSR for id with a fresh P-256 key.
func newCSR(t *testing.T, id spiffeid.ID) string {
	t.Helper()
	_, p := newKeyAndCSR(t, id)
	return p
}

func newKeyAndCSR(t *testing.T, id spiffeid.ID) (crypto.Signer, string) {
	t.Helper()
	return harness.KeyAndCSR(t, id)
}

func mustPool(t *testing.T, pemData []byte) *x509.CertPool {
	t.Helper()
	certs, err := pemutil.ParseCertificates(pemData)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}
