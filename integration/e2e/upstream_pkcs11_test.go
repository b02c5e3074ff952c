package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/softhsm"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/secretstore"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// pkcs11PIN is the e2e token's user PIN: the test looks for it where it
// must never be (logs, the environment, the CA state).
const pkcs11PIN = "e2e-pin-5f1c9a"

// TestPKCS11Upstream runs the HSM build (make build-hsm) against a real
// SoftHSM2 token and the real apiserver: `meshca root prepare --upstream
// pkcs11` makes the root's key in the token, and `meshca serve --upstream
// pkcs11` issues leaves that verify to the published bundle and renews
// its intermediate from the token, the bundle unchanged. The key stays
// where it belongs: pkcs11-tool reads it back sensitive and never
// extractable, and the CA state, meshca's logs and its /proc/<pid>/environ
// hold neither the root's key nor the PIN.
func TestPKCS11Upstream(t *testing.T) {
	h := newHSM(t)
	ns := cluster.Namespace(t, "pkcs11")
	secret := ns + "/meshca-ca"
	state := []string{"--state-secret", secret, "--kubeconfig", cluster.Kubeconfig}
	up := h.flags(80 * time.Second)

	prepare := exec.Command(h.bin, append(append([]string{"root", "prepare", "--reason", "e2e: root key in the HSM"}, state...), up...)...)
	prepared, err := prepare.CombinedOutput()
	if err != nil {
		t.Fatalf("root prepare --upstream pkcs11: %v\n%s", err, prepared)
	}
	store := &secretstore.Store{Client: cluster.Client, Namespace: ns, Name: "meshca-ca"}
	st, _, err := store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Authorities) != 1 || st.Authorities[0].Upstream.Type != "pkcs11" {
		t.Fatalf("the CA state holds %d authorities, the first from %+v; want one from pkcs11", len(st.Authorities), st.Authorities[0].Upstream)
	}
	rec := st.Authorities[0]
	root := rec.Root
	if rec.RootKey != nil {
		t.Fatal("the CA state holds a key for the root kept in the token")
	}
	keyInToken(t, h, 1, rec.Upstream.Key)

	lease := cluster.Namespace(t, "pkcs11-lease")
	m := harness.StartMeshca(t, h.bin, append(append(append([]string{}, state...), up...),
		"--intermediate-renew-at", "0.75", "--default-ttl", "1m", "--max-ttl", "1m", "--publish-root-cert-configmaps", "--trust-lease-namespace", lease)...)
	w := cluster.NewWorkload(t, cluster.Namespace(t, "pkcs11-wl"), "web", "node-a")
	published := publishedBundle(t, w.Namespace)
	c := (&server{Meshca: m, roots: certs.Pool(published...)}).client(t, w.Token)
	first := fetchVerified(t, c, w, published, root)

	// 80 s intermediates renewed with three quarters left (above the
	// minute leaves of 1m need then): one is due 20 s after the last; the
	// renewer looks every 10 s.
	mark := m.LogMark()
	if !m.WaitForLogAfter(mark, 60*time.Second, `"msg":"intermediate renewed"`, `"upstream":"pkcs11"`) {
		t.Fatalf("no intermediate renewed from the token within 60s:\n%s", m.Logs())
	}
	second := fetchVerified(t, c, w, publishedBundle(t, w.Namespace), root)
	if second.Equal(first) {
		t.Fatal("the leaves' intermediate did not change after a renewal")
	}
	if after := publishedBundle(t, w.Namespace); !certs.SameCerts(after, published) {
		t.Fatalf("a renewal under the same root changed the published bundle (%d roots, was %d)", len(after), len(published))
	}
	harness.Report(t, "pkcs11 upstream: intermediate renewed by the SoftHSM2 token, bundle unchanged (%d root)", len(published))

	noKeyInState(t, store, root)
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", m.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for where, text := range map[string]string{
		"meshca serve's logs":                         m.Logs(),
		"meshca root prepare's output":                string(prepared),
		"/proc/" + strconv.Itoa(m.Pid()) + "/environ": string(bytes.ReplaceAll(environ, []byte{0}, []byte{'\n'})),
	} {
		clean(t, where, text)
		if strings.Contains(text, "PRIVATE KEY") {
			t.Errorf("%s holds a PEM private key", where)
		}
	}
}

// hsmToken is a SoftHSM2 token of a test's own and the HSM build of
// meshca that uses it.
type hsmToken struct {
	dir     *softhsm.Dir
	label   string
	pinFile string
	bin     string // meshca-hsm
}

var hsmBuild struct {
	once sync.Once
	bin  string
	err  error
}

// newHSM builds meshca-hsm (once for the package), initialises a token
// in a SoftHSM2 directory of t's own, writes its PIN to a 0600 file, and
// points SoftHSM2 at it for the processes t starts.
func newHSM(t *testing.T) *hsmToken {
	t.Helper()
	if err := softhsm.Available(); err != nil {
		t.Fatalf("the real SoftHSM2 is required: %v", err)
	}
	hsmBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "meshca-hsm-")
		if err != nil {
			hsmBuild.err = err
			return
		}
		hsmBuild.bin, hsmBuild.err = harness.BuildMeshcaHSM(dir)
	})
	if hsmBuild.err != nil {
		t.Fatal(hsmBuild.err)
	}
	dir := t.TempDir()
	sd, err := softhsm.NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := &hsmToken{dir: sd, label: "meshca-e2e", pinFile: filepath.Join(dir, "pin"), bin: hsmBuild.bin}
	if err := sd.InitToken(h.label, pkcs11PIN, "e2e-so-pin"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.pinFile, []byte(pkcs11PIN+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(softhsm.ConfEnv, sd.Conf) // meshca's processes inherit it
	return h
}

// flags are the upstream's, with intermediates of ttl.
func (h *hsmToken) flags(ttl time.Duration) []string {
	return []string{"--upstream", "pkcs11", "--pkcs11-module", softhsm.Module, "--pkcs11-token-label", h.label,
		"--pkcs11-pin-file", h.pinFile, "--intermediate-ttl", ttl.String()}
}

// keyInToken reads the root keys back with pkcs11-tool, not meshca's
// library: n private keys, each generated in the token, sensitive, never
// extractable, only for signing, invisible without the PIN; and ref, a
// Ref.Key, names one of them.
func keyInToken(t *testing.T, h *hsmToken, n int, ref string) {
	t.Helper()
	objs, err := h.dir.Objects(h.label, pkcs11PIN)
	if err != nil {
		t.Fatal(err)
	}
	var named bool
	var priv int
	for _, k := range objs {
		if k.Class != "Private Key" {
			continue
		}
		priv++
		label := "pkcs11:object=" + strings.ReplaceAll(strings.ReplaceAll(k.Label, " ", "%20"), ":", "%3A") + ";id="
		named = named || strings.HasPrefix(ref, label)
		for _, want := range []string{"sensitive", "always sensitive", "never extractable", "local"} {
			if !slices.Contains(k.Access, want) {
				t.Errorf("root key %q: access %q lacks %q", k.Label, k.Access, want)
			}
		}
		if slices.Contains(k.Access, "extractable") || !slices.Equal(k.Usage, []string{"sign"}) {
			t.Errorf("root key %q is %q, for %q; want not extractable, for signing only", k.Label, k.Access, k.Usage)
		}
	}
	if priv != n || !named {
		t.Fatalf("the token holds %d private keys, want %d, one of them %s: %+v", priv, n, ref, objs)
	}
	anon, err := h.dir.Objects(h.label, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range anon {
		if o.Class == "Private Key" {
			t.Errorf("the root key is visible without the PIN: %+v", o)
		}
	}
}

// publishedBundle is istio-ca-root-cert in ns, once meshca wrote it.
func publishedBundle(t *testing.T, ns string) []*x509.Certificate {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cm, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), trust.ConfigMapName, metav1.GetOptions{})
		if err == nil {
			roots, err := pemutil.ParseCertificates([]byte(cm.Data[trust.DataKey]))
			if err != nil {
				t.Fatal(err)
			}
			return roots
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in %s within 30s: %v", trust.ConfigMapName, ns, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// fetchVerified asks for w's SVID and verifies it as a workload would,
// against bundle, and that its intermediate is root's; it returns the
// intermediate.
func fetchVerified(t *testing.T, c interface {
	Fetch(context.Context, spiffeid.ID, caclient.Options) (*caclient.SVID, error)
}, w *harness.Workload, bundle []*x509.Certificate, root *x509.Certificate) *x509.Certificate {
	t.Helper()
	svid, err := c.Fetch(context.Background(), workloadID(w), caclient.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	if _, _, err := x509svid.Verify(svid.Chain, x509bundle.FromX509Authorities(td, bundle)); err != nil {
		t.Fatalf("the leaf does not verify to the published bundle: %v", err)
	}
	if len(svid.Chain) != 2 || svid.Chain[1].CheckSignatureFrom(root) != nil {
		t.Fatalf("the leaf's chain has %d certificates; want the leaf and an intermediate the token's root signed", len(svid.Chain))
	}
	return svid.Chain[1]
}

// noKeyInState: the CA state Secret keeps each intermediate's key, which
// meshca signs leaves with, and of the root only the certificate and its
// Ref: no private key in it is the root's, nor is the PIN.
func noKeyInState(t *testing.T, store *secretstore.Store, root *x509.Certificate) {
	t.Helper()
	s, err := cluster.Client.CoreV1().Secrets(store.Namespace).Get(context.Background(), store.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range s.Data {
		clean(t, "the CA state's "+name, string(data))
		for rest := data; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if !strings.Contains(b.Type, "PRIVATE KEY") {
				continue
			}
			key, err := pemutil.ParsePrivateKey(pem.EncodeToMemory(b))
			if err != nil {
				t.Fatalf("the CA state's %s: %v", name, err)
			}
			if csr.SamePublicKey(key.Public(), root.PublicKey) {
				t.Fatalf("the CA state's %s holds the root's private key", name)
			}
		}
	}
}

// clean fails t if text holds the PIN.
func clean(t *testing.T, where, text string) {
	t.Helper()
	if strings.Contains(text, pkcs11PIN) {
		t.Errorf("%s holds the token's PIN", where)
	}
}
