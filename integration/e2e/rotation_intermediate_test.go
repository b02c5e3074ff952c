package e2e

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
)

// TestIntermediateRenewalLive: an operator moves a running meshca from
// its root to an intermediate under it, then renews that intermediate,
// the root staying the one root workloads trust. The renewal is an
// authority of its own: `activate` takes it at once, since its root has
// been served all along; the bundle never changes; and a leaf of the
// old intermediate, retired by force, no longer renews by mTLS although
// it still chains to the root.
func TestIntermediateRenewalLive(t *testing.T) {
	// Leaves of 40 s, with no backdate: the first activation waits for
	// half of that after the root entered the bundle.
	const ttl = 40 * time.Second
	s := startServer(t, "--backdate=0s")
	w := cluster.NewWorkload(t, cluster.Namespace(t, "renewal"), "web", "node-a")
	id := workloadID(w)
	c := s.client(t, w.Token)
	fetch := func() *caclient.SVID {
		t.Helper()
		svid, err := c.Fetch(context.Background(), id, caclient.Options{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return svid
	}
	first := fetch()
	if len(first.Roots) != 1 || len(first.Chain) != 1 {
		t.Fatalf("before: %d roots, chain of %d, want the root signing alone", len(first.Roots), len(first.Chain))
	}
	root := first.Roots[0]
	dir := t.TempDir()
	rootKey, err := pemutil.ParsePrivateKey(mustRead(t, filepath.Join(s.stateDir, keymgr.KeyEntry(root))))
	if err != nil {
		t.Fatal(err)
	}
	rootFile := writeFile(t, dir, "root.pem", pemutil.EncodeCertificates(root), 0o644)
	st := "--state-dir=" + s.stateDir

	// prepare and activate an intermediate under the root, then wait
	// until the server signs with it.
	switchTo := func(name string, atOnce bool) (*x509.Certificate, string) {
		t.Helper()
		issuing := (&testca.CA{Cert: root, Key: rootKey}).NewIntermediate(t, "meshca e2e "+name, testca.Options{})
		inter := issuing.Cert
		keyPEM, err := pemutil.EncodePrivateKey(issuing.Key)
		if err != nil {
			t.Fatal(err)
		}
		certFile := writeFile(t, dir, name+".pem", pemutil.EncodeCertificates(inter), 0o644)
		keyFile := writeFile(t, dir, name+"-key.pem", keyPEM, 0o600)
		if out, code := rootStep(t, "prepare", st, "--cert", certFile, "--key", keyFile, "--root", rootFile, "--reason", "e2e: "+name); code != 0 {
			t.Fatalf("prepare %s: exit %d\n%s", name, code, out)
		}
		authID := keymgr.Fingerprint(inter)[:16]
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
			out, code := rootStep(t, "activate", authID, st, "--margin=0s", "--reason", "e2e: "+name)
			if code == 0 {
				break
			}
			if atOnce || code != 1 || time.Now().After(deadline) {
				t.Fatalf("activate %s: exit %d\n%s", name, code, out)
			}
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(250 * time.Millisecond) {
			svid := fetch()
			if len(svid.Roots) != 1 || !svid.Roots[0].Equal(root) {
				t.Fatalf("the bundle changed: %d roots", len(svid.Roots))
			}
			if len(svid.Chain) == 2 && svid.Chain[1].Equal(inter) {
				if err := svid.Chain[0].CheckSignatureFrom(inter); err != nil {
					t.Fatalf("the leaf sent with %s is not its: %v", name, err)
				}
				return inter, authID
			}
			if time.Now().After(deadline) {
				t.Fatalf("the server did not sign with %s within 10s of activate", name)
			}
		}
	}
	_, firstID := switchTo("issuing-1", false)
	underFirst := fetch()
	renewal := s.renewalClient(t, underFirst)
	if _, err := renewal.Fetch(context.Background(), id, caclient.Options{TTL: ttl}); err != nil {
		t.Fatalf("renewal by a leaf of the active intermediate: %v", err)
	}

	// The renewed intermediate under the same root signs at once.
	switchTo("issuing-2", true)
	var view struct {
		Authorities []struct {
			ID, State  string
			RootSha256 string `json:"rootSha256"`
		}
	}
	out, code := rootStep(t, "status", st, "-o", "json")
	if err := json.Unmarshal([]byte(out), &view); code != 0 || err != nil {
		t.Fatalf("status: exit %d, %v\n%s", code, err, out)
	}
	for _, a := range view.Authorities {
		if a.RootSha256 != keymgr.Fingerprint(root) {
			t.Errorf("authority %s (%s) is under root %.16s, want %.16s", a.ID, a.State, a.RootSha256, keymgr.Fingerprint(root))
		}
	}

	// The first intermediate's leaves live: retire is refused, then
	// forced. Its leaf still chains to the root, and renews nothing.
	if out, code := rootStep(t, "retire", firstID, st); code != 1 || !strings.Contains(out, "safe at") {
		t.Fatalf("retire while its leaves live: exit %d, want a refusal\n%s", code, out)
	}
	if out, code := rootStep(t, "retire", firstID, st, "--force", "--reason", "e2e: intermediate key compromised"); code != 0 {
		t.Fatalf("retire --force: exit %d\n%s", code, out)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		_, err := renewal.Fetch(context.Background(), id, caclient.Options{TTL: ttl})
		if status.Code(err) == codes.Unauthenticated && strings.Contains(err.Error(), "retired authority") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("renewal by a leaf of the retired intermediate, 15s after retire: %v, want Unauthenticated", err)
		}
	}
	if last := fetch(); len(last.Roots) != 1 || !last.Roots[0].Equal(root) {
		t.Fatal("retiring an intermediate took its root, which another authority signs under, out of the bundle")
	}
}

// TestPluggedCARenewalLive: `meshca serve --ca-dir` follows its plugged-in
// directory as its owner (an operator, cert-manager) renews it: an
// intermediate renewed under the same root signs within a few seconds,
// without a restart and with the same bundle; a CA under a root workloads
// do not trust yet is refused, and the renewed one keeps signing.
func TestPluggedCARenewalLive(t *testing.T) {
	dir := t.TempDir()
	root := testca.NewRoot(t, "e2e plugged root", testca.Options{})
	first := root.NewIntermediate(t, "e2e plugged issuing 1", testca.Options{})
	first.WriteCACerts(t, dir, root.Cert)
	s := &server{Meshca: harness.StartMeshca(t, bin, "--ca-dir", dir, "--kubeconfig", cluster.Kubeconfig), roots: certs.Pool(root.Cert)}
	w := cluster.NewWorkload(t, cluster.Namespace(t, "plugged"), "web", "node-a")
	id := workloadID(w)
	c := s.client(t, w.Token)
	signedBy := func(want *testca.CA, within time.Duration) {
		t.Helper()
		for deadline := time.Now().Add(within); ; time.Sleep(250 * time.Millisecond) {
			svid, err := c.Fetch(context.Background(), id, caclient.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(svid.Roots) != 1 || !svid.Roots[0].Equal(root.Cert) {
				t.Fatalf("the bundle changed: %d roots", len(svid.Roots))
			}
			if len(svid.Chain) == 2 && svid.Chain[1].Equal(want.Cert) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("not signed by %q within %v", want.Cert.Subject, within)
			}
		}
	}
	signedBy(first, 0)

	second := root.NewIntermediate(t, "e2e plugged issuing 2", testca.Options{})
	second.WriteCACerts(t, dir, root.Cert)
	signedBy(second, 10*time.Second)

	stranger := testca.NewRoot(t, "e2e untrusted root", testca.Options{})
	stranger.NewIntermediate(t, "e2e issuing under it", testca.Options{}).WriteCACerts(t, dir, stranger.Cert)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(s.Logs(), "which workloads do not trust yet"); time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server did not log the refusal of a CA under an untrusted root within 10s")
		}
	}
	signedBy(second, 0)
}

// renewalClient is a client that authenticates by svid alone, as a
// workload renewing its certificate.
func (s *server) renewalClient(t *testing.T, svid *caclient.SVID) *checked.Client {
	t.Helper()
	c, err := checked.NewClient(t, caclient.Config{Addr: s.Addr, ServerName: "istiod.istio-system.svc", Roots: s.roots,
		ClusterID: authpb.DefaultClusterID, Certificate: svid.TLSCertificate()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, dir, name string, data []byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	return p
}
