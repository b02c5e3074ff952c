package signers

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/internal/testca"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// pki is harness.ExternalPKI with cfssl's auth keys: auth.key, and
// wrong.key, which the server does not know.
type pki struct {
	*harness.ExternalPKI
	root, inter *testca.CA
}

func newPKI(t testing.TB) *pki {
	x := harness.NewExternalPKI(t)
	p := &pki{ExternalPKI: x, root: x.Root, inter: x.Inter}
	p.write(t, "auth.key", []byte(authKey+"\n"))
	p.write(t, "wrong.key", []byte("fedcba9876543210fedcba9876543210\n"))
	return p
}

func (p *pki) write(t testing.TB, name string, data []byte) { p.Write(t, name, data) }

func (p *pki) path(name string) string { return p.Path(name) }

// issue gets an SVID from meshca for a fresh workload and checks it against
// the pinned root: leaf, the intermediate, and the root as the bundle.
func (p *pki) issue(t *testing.T, m *harness.Meshca) (*caclient.SVID, error) {
	return p.issueCtx(context.Background(), t, m)
}

func (p *pki) issueCtx(ctx context.Context, t *testing.T, m *harness.Meshca) (*caclient.SVID, error) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return p.issueKey(ctx, t, m, key)
}

// issueRSA is issue with an RSA key, as istio-agent's default is; it
// checks that the leaf carries exactly the usages of RSA keys.
func (p *pki) issueRSA(t *testing.T, m *harness.Meshca) (*caclient.SVID, error) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	svid, err := p.issueKey(context.Background(), t, m, key)
	if err != nil {
		return nil, err
	}
	if ku := svid.Chain[0].KeyUsage; ku != x509.KeyUsageDigitalSignature|x509.KeyUsageKeyEncipherment {
		t.Fatalf("RSA leaf key usage %v, want exactly digital signature and key encipherment", ku)
	}
	return svid, nil
}

// issueKey is issue with key.
func (p *pki) issueKey(ctx context.Context, t *testing.T, m *harness.Meshca, key crypto.Signer) (*caclient.SVID, error) {
	t.Helper()
	w := cluster.NewWorkload(t, cluster.Namespace(t, "ext"), "frontend", "node-a")
	id := spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", w.Namespace, "sa", w.ServiceAccount)
	roots := x509.NewCertPool()
	roots.AddCert(p.root.Cert)
	c, err := checked.NewClient(t, caclient.Config{Addr: m.Addr, ServerName: "istiod.istio-system.svc", Roots: roots, TokenFile: harness.WriteToken(t, w.Token)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	csrPEM, err := csr.Build(key, id)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := c.Call(ctx, string(csrPEM), id, caclient.Options{})
	if err != nil {
		return nil, err
	}
	svid, err := checked.Check(t, chain, id, key)
	if err != nil {
		t.Fatalf("caclient.Check: %v", err)
	}
	if len(svid.Chain) != 2 || !svid.Chain[1].Equal(p.inter.Cert) || len(svid.Roots) != 1 || !svid.Roots[0].Equal(p.root.Cert) {
		t.Fatalf("chain of %d with %d roots, want leaf+intermediate and the pinned root", len(svid.Chain), len(svid.Roots))
	}
	if got, _, err := x509svid.Verify(svid.Chain, x509bundle.FromX509Authorities(id.TrustDomain(), []*x509.Certificate{p.root.Cert})); err != nil || got != id {
		t.Fatalf("x509svid.Verify: %v %v", got, err)
	}
	return svid, nil
}

func TestMeshcaWithCfssl(t *testing.T) {
	p := newPKI(t)
	srv := harness.StartCfssl(t, cfsslBin, p.inter.Authority(), harness.CfsslOptions{AuthKey: authKey})
	common := []string{"--signer", "cfssl", "--kubeconfig", cluster.Kubeconfig, "--trust-anchors", p.path("anchors.pem")}
	remote := append(common, "--cfssl-url", srv.URL, "--serving-cert-file", p.path("serving.pem"), "--serving-key-file", p.path("serving-key.pem"))
	authed := slices.Concat(remote, []string{"--cfssl-auth-key-file", p.path("auth.key")})

	t.Run("remote authsign", func(t *testing.T) {
		m := harness.StartMeshca(t, bin, slices.Concat(authed, []string{"--cfssl-key-encipherment-profile", harness.CfsslRSAProfile})...)
		if _, err := p.issue(t, m); err != nil {
			t.Fatal(err)
		}
		if !m.WaitForLog(5*time.Second, `"backend":"cfssl"`, `"code":"OK"`) {
			t.Error("audit event does not name the cfssl backend")
		}
		if _, err := p.issueRSA(t, m); err != nil {
			t.Fatalf("RSA key: %v", err)
		}
	})
	t.Run("remote without an RSA profile", func(t *testing.T) {
		m := harness.StartMeshca(t, bin, authed...)
		_, err := p.issueRSA(t, m)
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("RSA key: %v, want FailedPrecondition", err)
		}
		if !m.WaitForLog(5*time.Second, `"reason":"signer_refused"`, `lacks key usage`) {
			t.Errorf("log lacks the reason:\n%s", m.Logs())
		}
	})
	t.Run("remote with a wrong auth key", func(t *testing.T) {
		m := harness.StartMeshca(t, bin, slices.Concat(remote, []string{"--cfssl-auth-key-file", p.path("wrong.key")})...)
		_, err := p.issue(t, m)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "refused") {
			t.Fatalf("got %v, want FailedPrecondition", err)
		}
		if !m.WaitForLog(5*time.Second, `"reason":"signer_refused"`, "invalid token") {
			t.Errorf("log lacks cfssl's reason:\n%s", m.Logs())
		}
	})
	t.Run("in process", func(t *testing.T) {
		m := harness.StartMeshca(t, bin, append(common, "--cfssl-ca-cert", p.path("ca.pem"), "--cfssl-ca-key", p.path("ca-key.pem"))...)
		if _, err := p.issue(t, m); err != nil {
			t.Fatal(err)
		}
	})
}

func TestMeshcaWithVault(t *testing.T) {
	p := newPKI(t)
	v := harness.StartVault(t, vaultBin)
	v.ConfigurePKI(t, "pki", p.inter.Authority(), harness.VaultRole{})
	p.write(t, "vault.token", []byte(harness.VaultRootToken))
	args := []string{"--signer", "vault", "--kubeconfig", cluster.Kubeconfig,
		"--vault-addr", v.Addr, "--vault-pki-mount", "pki", "--vault-role", harness.VaultMainRole, "--vault-token-file", p.path("vault.token"),
		"--trust-anchors", p.path("anchors.pem"), "--serving-cert-file", p.path("serving.pem"), "--serving-key-file", p.path("serving-key.pem")}

	// Without an RSA role, an RSA key is refused, and the log says what to set.
	noRSA := harness.StartMeshca(t, bin, args...)
	if _, err := p.issueRSA(t, noRSA); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("RSA key without --vault-rsa-role: %v, want FailedPrecondition", err)
	}
	if !noRSA.WaitForLog(5*time.Second, `"reason":"signer_refused"`, "--vault-rsa-role") {
		t.Errorf("log does not name --vault-rsa-role:\n%s", noRSA.Logs())
	}
	noRSA.Stop()

	m := harness.StartMeshca(t, bin, slices.Concat(args, []string{"--vault-rsa-role", harness.VaultRSARole, "--vault-relogin-backoff", "10s"})...)
	if _, err := p.issue(t, m); err != nil {
		t.Fatal(err)
	}
	if _, err := p.issueRSA(t, m); err != nil {
		t.Fatalf("RSA key: %v", err)
	}
	if strings.Contains(m.Logs(), harness.VaultRootToken+`"`) {
		t.Fatal("the Vault token reached the log")
	}

	// Vault stops mid-run: Unavailable within the client's deadline.
	v.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	start := time.Now()
	_, err := p.issueCtx(ctx, t, m)
	cancel()
	if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
		t.Fatalf("with Vault down: %v, want Unavailable", err)
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Fatalf("answer took %v, past the 5s deadline", d)
	}

	// Vault is back (empty, as dev servers are): meshca recovers, no restart.
	v.Start(t)
	v.ConfigurePKI(t, "pki", p.inter.Authority(), harness.VaultRole{})
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := p.issue(t, m)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
