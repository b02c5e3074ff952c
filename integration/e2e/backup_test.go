package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/secretstore"
)

// TestBackupRestoreStateSecret follows docs/operations.md for a CA state
// Secret: backed up while meshca runs (`kubectl get secret -o yaml`, less
// what the apiserver owns), lost (deleted; a replica that starts on
// nothing then makes a new root, of another CA state, and the trust
// publisher leaves the published bundle alone), and restored (that new
// state deleted, the backup created): meshca serves the same root again,
// a certificate issued before the loss verifies against the bundle it now
// hands out and renews by mTLS, a new one verifies against the bundle the
// workload held, and the publisher writes the bundle again.
func TestBackupRestoreStateSecret(t *testing.T) {
	t.Parallel()
	ns := cluster.Namespace(t, "backup-secret")
	lbls, sel := runLabel(t) // parallel: other tests' namespaces are not ours to write
	apps := trustNamespace(t, "backup-apps", lbls)
	args := []string{"--state-secret", ns + "/meshca-ca", "--kubeconfig", cluster.Kubeconfig,
		"--publish-root-cert-configmaps", "--trust-lease-namespace", ns, "--trust-namespace-selector", sel.String()}
	store := &secretstore.Store{Client: cluster.Client, Namespace: ns, Name: "meshca-ca"}
	w := cluster.NewWorkload(t, cluster.Namespace(t, "backup-wl"), "web", "node-a")

	m := harness.StartMeshca(t, bin, args...)
	roots := storedRoots(t, store)
	published := waitBundle(t, apps, "", 20*time.Second)
	before := fetchSVID(t, m, roots, w, nil)
	backup := backupSecret(t, ns, "meshca-ca")
	m.Stop()

	deleteSecret(t, ns, "meshca-ca")
	fresh := harness.StartMeshca(t, bin, args...)
	if sameCerts(storedRoots(t, store), roots) {
		t.Fatal("meshca started on a lost state Secret serves the old root: want a new one")
	}
	if !fresh.WaitForLog(20*time.Second, "belongs to another CA state") {
		t.Fatalf("the replica on a new CA state did not refuse to publish its bundle:\n%s", fresh.Logs())
	}
	if got := waitConfigMap(t, apps).Data[trust.DataKey]; got != published {
		t.Fatal("the replica on a new CA state replaced the published bundle")
	}
	fresh.Stop()

	deleteSecret(t, ns, "meshca-ca")
	restoreSecret(t, backup)
	restored := harness.StartMeshca(t, bin, args...)
	if !sameCerts(storedRoots(t, store), roots) {
		t.Fatal("the restored Secret does not hold the root backed up")
	}
	checkRestored(t, restored, roots, before, w)
	// The record on the Lease is the restored state's own (lineage and
	// sequence): it publishes, in a new namespace too.
	late := trustNamespace(t, "backup-late", lbls)
	if got := waitBundle(t, late, "", 60*time.Second); got != published {
		t.Fatalf("the restored server published another bundle than before the loss:\n%s", got)
	}
}

// TestBackupRestoreStateDir follows docs/operations.md for a state
// directory: copied under its lock (flock on .lock, which every writer
// takes) while meshca runs, lost, a new root made on the empty directory,
// then the copy put back: meshca serves the same root and the
// certificates on either side of the loss verify, as for the Secret.
func TestBackupRestoreStateDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "state")
	args := []string{"--state-dir", dir, "--kubeconfig", cluster.Kubeconfig}
	store := dirstore.Store{Dir: dir}
	w := cluster.NewWorkload(t, cluster.Namespace(t, "backup-dir"), "web", "node-a")

	m := harness.StartMeshca(t, bin, args...)
	roots := storedRoots(t, store)
	before := fetchSVID(t, m, roots, w, nil)
	unlock, err := dirstore.LockDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "backup")
	err = copyTree(dir, backup)
	if uerr := unlock(); err == nil {
		err = uerr
	}
	if err != nil {
		t.Fatal(err)
	}
	m.Stop()

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	fresh := harness.StartMeshca(t, bin, args...)
	if sameCerts(storedRoots(t, store), roots) {
		t.Fatal("meshca started on a lost state directory serves the old root: want a new one")
	}
	fresh.Stop()

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := copyTree(backup, dir); err != nil {
		t.Fatal(err)
	}
	restored := harness.StartMeshca(t, bin, args...)
	if !sameCerts(storedRoots(t, store), roots) {
		t.Fatal("the restored directory does not hold the root backed up")
	}
	checkRestored(t, restored, roots, before, w)
}

// checkRestored: m serves the bundle roots again; the SVID before, issued
// before the state was lost, verifies against the bundle m hands out now
// and renews by mTLS; a new SVID verifies against the bundle before held.
func checkRestored(t *testing.T, m *harness.Meshca, roots []*x509.Certificate, before *caclient.SVID, w *harness.Workload) {
	t.Helper()
	after := fetchSVID(t, m, roots, w, nil)
	if !sameCerts(after.Roots, roots) {
		t.Fatalf("after the restore meshca hands out %d roots, not the %d backed up", len(after.Roots), len(roots))
	}
	td := workloadID(w).TrustDomain()
	if _, _, err := x509svid.Verify(before.Chain, x509bundle.FromX509Authorities(td, after.Roots)); err != nil {
		t.Errorf("a certificate from before the loss does not verify against the restored bundle: %v", err)
	}
	if _, _, err := x509svid.Verify(after.Chain, x509bundle.FromX509Authorities(td, before.Roots)); err != nil {
		t.Errorf("a certificate from the restored state does not verify against the bundle from before: %v", err)
	}
	renewed := fetchSVID(t, m, roots, w, before)
	if !sameCerts(renewed.Roots, roots) {
		t.Error("the mTLS renewal's bundle is not the one backed up")
	}
}

// fetchSVID asks m for w's SVID, trusting roots for m's serving
// certificate, with w's token, or by mTLS with the SVID renew.
func fetchSVID(t *testing.T, m *harness.Meshca, roots []*x509.Certificate, w *harness.Workload, renew *caclient.SVID) *caclient.SVID {
	t.Helper()
	cfg := caclient.Config{Addr: m.Addr, ServerName: "istiod.istio-system.svc", Roots: certs.Pool(roots...), ClusterID: "Kubernetes"}
	if renew != nil {
		cfg.Certificate = renew.TLSCertificate()
	} else {
		cfg.TokenFile = harness.WriteToken(t, w.Token)
	}
	c, err := checked.NewClient(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	svid, err := c.Fetch(context.Background(), workloadID(w), caclient.Options{})
	if err != nil {
		t.Fatalf("CreateCertificate (mTLS renewal: %v): %v", renew != nil, err)
	}
	return svid
}

// storedRoots is the trust bundle of the CA state in store.
func storedRoots(t *testing.T, store keymgr.StateStore) []*x509.Certificate {
	t.Helper()
	st, _, err := store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.Bundle()
}

func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i].Raw, b[i].Raw) {
			return false
		}
	}
	return true
}

// backupSecret is `kubectl get secret -o yaml` of ns/name with the fields
// the apiserver sets removed, so that `kubectl create -f` takes it back.
func backupSecret(t *testing.T, ns, name string) []byte {
	t.Helper()
	s, err := cluster.Client.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}
	s.ObjectMeta = metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: s.Labels, Annotations: s.Annotations}
	out, err := yaml.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// restoreSecret creates the Secret of a backupSecret.
func restoreSecret(t *testing.T, backup []byte) {
	t.Helper()
	var s corev1.Secret
	if err := yaml.UnmarshalStrict(backup, &s); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Client.CoreV1().Secrets(s.Namespace).Create(context.Background(), &s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func deleteSecret(t *testing.T, ns, name string) {
	t.Helper()
	if err := cluster.Client.CoreV1().Secrets(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// copyTree copies the directory src to dst, which must not exist, file
// modes kept (keys are 0600), as `cp -a` would.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.Mkdir(target, info.Mode().Perm())
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, info.Mode().Perm())
	})
}
