package e2e

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/integration/harness/crlverify"
	"github.com/meshca/meshca/internal/pemutil"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
)

// TestVaultCRLPublished: against the real Vault and apiserver, meshca
// serve --signer vault --publish-crl publishes Vault's CRL as
// istio-ca-crl; a leaf Vault signed, revoked with meshca revoke --signer
// vault --cert, is then refused by the strict verifier, ztunnel's rules
// and openssl -crl_check_all, while another leaf passes all three, and
// no longer renews itself by certificate; --undo is refused; with Vault away the last CRL stays published and
// the log says so.
func TestVaultCRLPublished(t *testing.T) {
	v, token := startVault(t)
	x := harness.NewExternalPKI(t)
	// Vault holds the root that signs the leaves: its CRL is the only one
	// a verifier needs.
	v.ConfigurePKI(t, "pki", x.Root.Authority(), harness.VaultRole{})
	lbls, sel := runLabel(t)
	ns := trustNamespace(t, "vault-crl", lbls)
	apps := cluster.Namespace(t, "vault-crl-apps")
	login := []string{"--vault-addr", v.Addr, "--vault-token-file", token, "--vault-pki-mount", "pki"}
	m := harness.StartMeshca(t, bin, append(append([]string{"--signer", "vault", "--kubeconfig", cluster.Kubeconfig, "--vault-role", harness.VaultMainRole,
		"--publish-crl", "--trust-lease-namespace", ns, "--trust-namespace-selector", sel.String()}, login...), x.ServingArgs()...)...)

	pool := x509.NewCertPool()
	pool.AddCert(x.Root.Cert)
	svids := map[string]*caclient.SVID{}
	fetch := func(sa string) []*x509.Certificate {
		w := cluster.NewWorkload(t, apps, sa, "node-a")
		c, err := checked.NewClient(t, caclient.Config{Addr: m.Addr, ServerName: "istiod.istio-system.svc", Roots: pool, TokenFile: harness.WriteToken(t, w.Token)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		svid, err := c.Fetch(context.Background(), workloadID(w), caclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		svids[sa] = svid
		return svid.Chain
	}
	// renew renews sa's SVID by certificate (--cert-renewal, on by default).
	renew := func(sa string) error {
		svid := svids[sa]
		c, err := checked.NewClient(t, caclient.Config{Addr: m.Addr, ServerName: "istiod.istio-system.svc", Roots: pool,
			ClusterID: authpb.DefaultClusterID, Certificate: svid.TLSCertificate()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Fetch(context.Background(), svid.ID, caclient.Options{})
		return err
	}
	stolen, kept := fetch("stolen"), fetch("web")
	roots := []*x509.Certificate{x.Root.Cert}

	start := time.Now()
	published := func() string {
		if cm := crlConfigMap(t, ns, trust.CRLConfigMapName); cm != nil {
			return cm.Data[trust.CRLDataKey]
		}
		return ""
	}
	for published() == "" {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("no istio-ca-crl within 20s\n%s", m.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	harness.Report(t, "Vault's CRL published as istio-ca-crl %v after the first certificate", time.Since(start).Round(time.Millisecond))
	for _, chain := range [][]*x509.Certificate{stolen, kept} {
		if r := judge(t, ns, roots, chain); r != "" {
			t.Fatalf("before the revocation, %s is refused: %s", chain[0].URIs[0], r)
		}
	}

	file := filepath.Join(t.TempDir(), "stolen.pem")
	if err := os.WriteFile(file, pemutil.EncodeCertificates(stolen...), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := revokeCmd(t, append([]string{"--signer", "vault", "--cert", file, "--reason", "keyCompromise"}, login...)...)
	t.Logf("meshca revoke --signer vault --cert stolen.pem --reason keyCompromise\n%s", out)
	if code != 0 || !strings.Contains(out, "1 certificate(s) revoked in Vault (pki)") {
		t.Fatalf("revoke: exit %d\n%s", code, out)
	}
	revokedAt := time.Now()
	for judge(t, ns, roots, stolen) != crlverify.ReasonRevoked {
		if time.Since(revokedAt) > 30*time.Second {
			t.Fatalf("the revoked leaf is not refused by the published CRL within 30s\n%s", m.Logs())
		}
		time.Sleep(250 * time.Millisecond)
	}
	harness.Report(t, "a leaf revoked in Vault refused by the published istio-ca-crl %v after meshca revoke", time.Since(revokedAt).Round(time.Millisecond))
	if r := judge(t, ns, roots, kept); r != "" {
		t.Fatalf("a leaf not revoked is refused: %s", r)
	}
	// Nor does the revoked leaf renew itself by certificate; the other does.
	if err := renew("stolen"); status.Code(err) != codes.Unauthenticated ||
		status.Convert(err).Message() != "client certificate is revoked: authenticate with a service-account token" {
		t.Fatalf("renewal by the leaf revoked in Vault: %v, want Unauthenticated, revoked", err)
	}
	if err := renew("web"); err != nil {
		t.Fatalf("renewal by a leaf not revoked: %v", err)
	}

	out, code = revokeCmd(t, append([]string{"--signer", "vault", "--cert", file, "--undo"}, login...)...)
	if code != 1 || !strings.Contains(out, "Vault cannot take a revocation back") {
		t.Fatalf("--undo: exit %d, want 1 and the refusal\n%s", code, out)
	}

	// The nextUpdate gauges follow Vault's CRL (72h by default), and the
	// reads are counted.
	now := float64(time.Now().Unix())
	checkSamples(t, scrapeMetrics(t, m.AdminAddr), []wantSample{
		{"meshca_trust_crl_next_update_timestamp_seconds", nil, now + 3600, now + 73*3600},
		{"meshca_trust_crl_this_update_timestamp_seconds", nil, now - 60, now},
		{"meshca_trust_crl_source_reads_total", map[string]string{"backend": "vault", "result": "ok"}, 2, 1e6},
		{"meshca_trust_crl_source_reads_total", map[string]string{"backend": "vault", "result": "error"}, 0, 0},
	})

	// Vault away: the last CRL stays published, and the log says so.
	last := published()
	mark := len(m.Logs())
	v.Stop()
	if !m.WaitForLogAfter(mark, 40*time.Second, "the signing backend's CRLs not taken; the last ones read stay published") {
		t.Fatalf("no log of the failed read within 40s\n%s", m.Logs())
	}
	if got := published(); got != last {
		t.Fatalf("with Vault away, istio-ca-crl changed:\n%s", got)
	}
	if r := judge(t, ns, roots, stolen); r != crlverify.ReasonRevoked {
		t.Fatalf("with Vault away, the revoked leaf: %q", r)
	}
	checkSamples(t, scrapeMetrics(t, m.AdminAddr), []wantSample{
		{"meshca_trust_crl_source_reads_total", map[string]string{"backend": "vault", "result": "error"}, 1, 1e6},
		{"meshca_trust_crl_next_update_timestamp_seconds", nil, now + 3600, now + 73*3600},
	})
	if err := renew("stolen"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("with Vault away, renewal by the revoked leaf: %v", err)
	}
}
