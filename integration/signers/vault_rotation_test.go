package signers

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rotationLeafTTL is short so that the guards pass in seconds: activation
// waits half of it plus --margin, retirement its end plus --margin.
const rotationLeafTTL = 6 * time.Second

// meshcaRoot runs `meshca root args...` and returns its output and exit
// code.
func meshcaRoot(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"root"}, args...)...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return string(out), 0
}

// rootUntilDone repeats a guarded step until it is taken; every refusal
// must be a guard's (exit 1) that says when the step becomes safe.
func rootUntilDone(t *testing.T, within time.Duration, args ...string) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		out, code := meshcaRoot(t, args...)
		switch {
		case code == 0:
			return out
		case code != 1 || !strings.Contains(out, "safe at"):
			t.Fatalf("meshca root %s: exit %d: %s", args[0], code, out)
		case time.Now().After(deadline):
			t.Fatalf("meshca root %s still refused after %v: %s", args[0], within, out)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// extIssuer gets SVIDs from a meshca with an external backend whose trust
// bundle is its CA state; the client verifies meshca's serving certificate
// against servingRoot, the root of the state it was issued under (meshca
// refuses one that does not chain to its bundle).
type extIssuer struct {
	m           *harness.Meshca
	servingRoot *x509.Certificate
}

// issue asks for a fresh workload's SVID and checks it: the chain must
// verify against the bundle of the same reply.
func (e *extIssuer) issue(t *testing.T) (*caclient.SVID, error) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	w := cluster.NewWorkload(t, cluster.Namespace(t, "rot"), "app", "node-a")
	id := spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", w.Namespace, "sa", w.ServiceAccount)
	c, err := checked.NewClient(t, caclient.Config{Addr: e.m.Addr, ServerName: "istiod.istio-system.svc", Roots: certs.Pool(e.servingRoot),
		TokenFile: harness.WriteToken(t, w.Token)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	csrPEM, err := csr.Build(crypto.Signer(key), id)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := c.Call(context.Background(), string(csrPEM), id, caclient.Options{TTL: rotationLeafTTL})
	if err != nil {
		return nil, err
	}
	svid, err := checked.Check(t, chain, id, key)
	if err != nil {
		t.Fatalf("caclient.Check: %v", err)
	}
	return svid, nil
}

// mustIssue is issue that must succeed under root, with that many roots
// in the bundle.
func (e *extIssuer) mustIssue(t *testing.T, root *x509.Certificate, roots int) *caclient.SVID {
	t.Helper()
	var svid *caclient.SVID
	deadline := time.Now().Add(2 * keymgr.DefaultFollowInterval)
	for {
		var err error
		svid, err = e.issue(t)
		if err != nil {
			t.Fatal(err)
		}
		top := svid.Chain[len(svid.Chain)-1]
		if top.CheckSignatureFrom(root) == nil && len(svid.Roots) == roots {
			return svid
		}
		if time.Now().After(deadline) { // the server follows the state within its interval
			t.Fatalf("leaf under %q with %d roots, want under %q with %d", top.Issuer, len(svid.Roots), root.Subject, roots)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// newServing writes serving.pem and serving-key.pem in dir: meshca's
// serving certificate, issued by root (the CA state's first root, whose
// key cfssl's test holds).
func newServing(t *testing.T, dir string, root *testca.CA) {
	t.Helper()
	serving, err := keymgr.IssueServing(root.Authority(), keymgr.ServingOptions{Names: []string{"istiod.istio-system.svc"}})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := pemutil.EncodePrivateKey(serving.PrivateKey.(crypto.Signer))
	writeFile(t, filepath.Join(dir, "serving.pem"), pemutil.EncodeCertificates(serving.Leaf))
	writeFile(t, filepath.Join(dir, "serving-key.pem"), key)
}

// newVaultServing writes serving.pem and serving-key.pem in dir: meshca's
// serving certificate, signed by mount's default issuer through its
// istiod role (harness.VaultIstiodRole), as cert-manager's Vault issuer
// would sign it.
func newVaultServing(t *testing.T, v *harness.Vault, mount, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{"istiod.istio-system.svc"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	s, err := v.Client.Logical().WriteWithContext(context.Background(), mount+"/sign/"+harness.VaultIstiodRole, map[string]any{
		"csr": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), "alt_names": "istiod.istio-system.svc", "ttl": "1h"})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := pemutil.EncodePrivateKey(key)
	writeFile(t, filepath.Join(dir, "serving.pem"), []byte(s.Data["certificate"].(string)+"\n"))
	writeFile(t, filepath.Join(dir, "serving-key.pem"), keyPEM)
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// stateRoots reads the CA state directory's authorities by phase.
func stateRoots(t *testing.T, dir string) map[keymgr.Phase][]*keymgr.AuthorityRecord {
	t.Helper()
	st, _, err := (&dirstore.Store{Dir: dir}).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[keymgr.Phase][]*keymgr.AuthorityRecord{}
	for _, a := range st.Authorities {
		out[a.Phase] = append(out[a.Phase], a)
	}
	return out
}

// TestVaultRootRotation drives Vault's multi-issuer PKI with `meshca root
// --signer vault` while `meshca serve --signer vault` follows the CA state:
// prepare creates a root issuer in Vault and adds it to the bundle without
// changing what Vault signs with; a Vault switched early (by hand) is
// caught and its leaves refused; activate makes the new issuer Vault's
// default once the guard allows; retire drops the old root and deletes
// its issuer and key in Vault. A second rotation goes to an intermediate
// under a new root in another mount.
func TestVaultRootRotation(t *testing.T) {
	ctx := context.Background()
	v := harness.StartVault(t, vaultBin)
	v.MountPKI(t, "pki")
	v.MountPKI(t, "pki_root")
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	writeFile(t, filepath.Join(dir, "token"), []byte(harness.VaultRootToken))
	vaultArgs := []string{"--signer", "vault", "--vault-addr", v.Addr, "--vault-token-file", filepath.Join(dir, "token"), "--vault-pki-mount", "pki"}
	st := []string{"--state-dir", state}
	args := func(verb string, extra ...string) []string {
		return append(append(append([]string{verb}, st...), vaultArgs...), extra...)
	}

	out, code := meshcaRoot(t, args("prepare", "--lifetime", "2h", "--reason", "first Vault root")...)
	if code != 0 {
		t.Fatalf("first prepare: exit %d: %s", code, out)
	}
	v.ConfigureRoles(t, "pki", harness.VaultRole{NotBefore: "1s"})
	first := stateRoots(t, state)[keymgr.PhaseActive][0]
	if !first.External || first.Key != nil {
		t.Fatalf("the Vault authority holds a key in meshca's state (external %v)", first.External)
	}

	newVaultServing(t, v, "pki", dir)
	m := harness.StartMeshca(t, bin, append(append([]string{"--kubeconfig", cluster.Kubeconfig, "--vault-role", harness.VaultMainRole,
		"--vault-rsa-role", harness.VaultRSARole, "--serving-cert-file", filepath.Join(dir, "serving.pem"),
		"--serving-key-file", filepath.Join(dir, "serving-key.pem"), "--default-ttl", rotationLeafTTL.String(), "--max-ttl", "1m",
		"--rotation-margin", "1s"}, st...), vaultArgs...)...)
	e := &extIssuer{m: m, servingRoot: first.Root}
	e.mustIssue(t, first.Root, 1)

	// prepare: a second root issuer; Vault keeps signing with the first.
	if out, code := meshcaRoot(t, args("prepare", "--lifetime", "2h")...); code != 0 {
		t.Fatalf("prepare: exit %d: %s", code, out)
	}
	second := stateRoots(t, state)[keymgr.PhasePrepared][0]
	e.mustIssue(t, first.Root, 2)

	// Vault switched by hand before the guard allows: meshca refuses to
	// hand out leaves under a root workloads may not trust yet.
	defaultIssuer := func() string {
		s, err := v.Client.Logical().ReadWithContext(ctx, "pki/config/issuers")
		if err != nil {
			t.Fatal(err)
		}
		return s.Data["default"].(string)
	}
	was := defaultIssuer()
	secondID := issuerIDOf(t, v, "pki", second.Cert)
	setDefault(t, v, secondID)
	if _, err := e.issue(t); status.Code(err) != codes.Unavailable {
		t.Fatalf("a leaf under the prepared root before its activation is safe: %v, want Unavailable", err)
	}
	if !m.WaitForLog(5*time.Second, "already signs under this prepared authority") {
		t.Error("no log line says the backend signs under a prepared authority")
	}
	setDefault(t, v, was)

	// activate: refused until the guard allows, then Vault's default.
	out = rootUntilDone(t, 30*time.Second, args("activate", "--margin", "1s")...)
	t.Logf("activate: %s", strings.TrimSpace(out))
	if got := defaultIssuer(); got != secondID {
		t.Fatalf("Vault's default issuer is %s after activate, want %s", got, secondID)
	}
	e.mustIssue(t, second.Root, 2)

	// retire: refused while leaves of the first root live, then its
	// issuer and key are gone from Vault and its root from the bundle.
	out = rootUntilDone(t, 60*time.Second, args("retire", "--margin", "1s")...)
	if !strings.Contains(out, "deleted in Vault") {
		t.Errorf("retire does not report the deleted issuer: %s", out)
	}
	if id := issuerIDOf(t, v, "pki", first.Cert); id != "" {
		t.Errorf("the retired issuer %s is still in Vault", id)
	}
	e.mustIssue(t, second.Root, 1)

	// An intermediate under a new root in pki_root.
	if out, code := meshcaRoot(t, args("prepare", "--vault-issuer-type", "intermediate", "--vault-root-mount", "pki_root", "--lifetime", "2h")...); code != 0 {
		t.Fatalf("prepare intermediate: exit %d: %s", code, out)
	}
	third := stateRoots(t, state)[keymgr.PhasePrepared][0]
	if third.Cert.Equal(third.Root) || third.Cert.CheckSignatureFrom(third.Root) != nil {
		t.Fatal("the intermediate authority is not an intermediate under its new root")
	}
	rootUntilDone(t, 30*time.Second, args("activate", "--margin", "1s")...)
	svid := e.mustIssue(t, third.Root, 2)
	if len(svid.Chain) != 2 || !svid.Chain[1].Equal(third.Cert) {
		t.Fatalf("chain of %d, want the leaf and Vault's new intermediate", len(svid.Chain))
	}
	if out, code := meshcaRoot(t, args("retire", "--force", "--reason", "end of test")...); code != 0 {
		t.Fatalf("forced retire: exit %d: %s", code, out)
	}
	e.mustIssue(t, third.Root, 1)
	t.Logf("three Vault authorities rotated: %.12s → %.12s → %.12s (intermediate)", first.ID(), second.ID(), third.ID())
}

// issuerIDOf is the id of the issuer of mount with a key whose certificate
// is cert, or "".
func issuerIDOf(t *testing.T, v *harness.Vault, mount string, cert *x509.Certificate) string {
	t.Helper()
	ctx := context.Background()
	list, err := v.Client.Logical().ListWithContext(ctx, mount+"/issuers")
	if err != nil {
		t.Fatal(err)
	}
	if list == nil {
		return ""
	}
	for _, k := range list.Data["keys"].([]any) {
		s, err := v.Client.Logical().ReadWithContext(ctx, mount+"/issuer/"+k.(string))
		if err != nil {
			t.Fatal(err)
		}
		certs, err := pemutil.ParseCertificates([]byte(s.Data["certificate"].(string)))
		if err == nil && certs[0].Equal(cert) && s.Data["key_id"] != "" {
			return k.(string)
		}
	}
	return ""
}

func setDefault(t *testing.T, v *harness.Vault, id string) {
	t.Helper()
	if _, err := v.Client.Logical().WriteWithContext(context.Background(), "pki/config/issuers", map[string]any{"default": id}); err != nil {
		t.Fatal(err)
	}
}
