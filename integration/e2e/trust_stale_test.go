package e2e

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
)

// TestStaleLeaderKeepsNewerBundle: a replica whose CA state is behind the
// one last published (a restored copy here; a lagging store or a state it
// cannot use in a cluster) takes the trust publisher's Lease and does not
// write its older bundle over the newer one: the ConfigMap keeps the
// prepared root, with the sequence of the state it came from; the replica
// says why it writes nothing and steps down, so that a current replica
// can lead. With the sequence removed from the record on the Lease (going
// back on purpose), it writes its bundle when it leads again. What the
// ConfigMaps carry decides nothing: a tenant's forged sequence neither
// stops the publisher nor keeps its namespace from being updated.
func TestStaleLeaderKeepsNewerBundle(t *testing.T) {
	lbls, sel := runLabel(t)
	lease := cluster.Namespace(t, "stale-lease")
	apps := trustNamespace(t, "stale-apps", lbls)
	publish := []string{"--publish-root-cert-configmaps", "--trust-lease-namespace", lease, "--trust-namespace-selector", sel.String()}
	s := startServer(t, publish...)
	published := func() (roots int, seq string) {
		cm, err := cluster.Client.CoreV1().ConfigMaps(apps).Get(context.Background(), trust.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return 0, ""
		}
		return strings.Count(cm.Data[trust.DataKey], "BEGIN CERTIFICATE"), cm.Annotations[trust.AnnotationSequence]
	}
	waitRoots := func(n int, within time.Duration) string {
		t.Helper()
		for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
			if roots, seq := published(); roots == n {
				return seq
			}
			if time.Now().After(deadline) {
				roots, seq := published()
				t.Fatalf("%s in %s holds %d roots (sequence %q), want %d", trust.ConfigMapName, apps, roots, seq, n)
			}
		}
	}
	before := waitRoots(1, 20*time.Second)
	old := copyStateDir(t, s.stateDir)
	// A tenant who may edit ConfigMaps in its namespace forges a huge
	// sequence of the CA's lineage on its own: the publisher believes
	// only the Lease, and updates that namespace too.
	tenant := trustNamespace(t, "stale-tenant", lbls)
	forged := waitConfigMap(t, tenant)
	forged.Annotations[trust.AnnotationSequence] = "18446744073709551615"
	if _, err := cluster.Client.CoreV1().ConfigMaps(tenant).Update(context.Background(), forged, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, code := rootStep(t, "prepare", "--state-dir="+s.stateDir); code != 0 {
		t.Fatalf("prepare: exit %d\n%s", code, out)
	}
	after := waitRoots(2, 5*time.Second)
	if before == "" || after == "" || before == after {
		t.Fatalf("the ConfigMap's sequence went from %q to %q on prepare, want two different sequences", before, after)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		cm := waitConfigMap(t, tenant)
		if strings.Count(cm.Data[trust.DataKey], "BEGIN CERTIFICATE") == 2 && cm.Annotations[trust.AnnotationSequence] == after {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tenant's forged ConfigMap was not updated: %v %q", cm.Annotations, cm.Data[trust.DataKey])
		}
	}
	s.Stop() // a graceful stop releases the Lease at once

	stale := harness.StartMeshca(t, bin, append([]string{"--state-dir", old, "--kubeconfig", cluster.Kubeconfig}, publish...)...)
	if !stale.WaitForLog(20*time.Second, "newer than this replica's CA state") || !stale.WaitForLog(15*time.Second, "stepped down") {
		t.Fatalf("the replica behind did not say why it does not publish, or did not step down:\n%s", stale.Logs())
	}
	time.Sleep(time.Second)
	if roots, seq := published(); roots != 2 || seq != after {
		t.Fatalf("the replica behind wrote its older bundle: %d roots, sequence %q (want 2, %q)", roots, seq, after)
	}

	// Going back on purpose (docs/rotation.md): with the sequence
	// removed from the Lease's record, as `kubectl annotate lease
	// meshca-trust-publisher meshca.io/bundle-sequence-` does, the older
	// bundle is written.
	unrecord(t, lease, trust.AnnotationSequence)
	// The only replica campaigns again after serve.StepDownBackoff (30 s).
	if seq := waitRoots(1, 50*time.Second); seq != before {
		t.Fatalf("the older bundle was written with sequence %q, want %q", seq, before)
	}
}

// copyStateDir copies a state directory, file modes kept (keys are
// 0600), as a backup would.
func copyStateDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(target, info.Mode().Perm())
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, info.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestNewLineageKeepsPublishedBundle: a replica whose CA state was
// bootstrapped anew (its state Secret or directory lost: another
// lineage) takes the Lease and does not replace the published bundle,
// whose roots every live workload certificate was issued under: it says
// why and steps down. With the Lease's record removed (a new CA on
// purpose), it publishes its own.
func TestNewLineageKeepsPublishedBundle(t *testing.T) {
	t.Parallel()
	lbls, sel := runLabel(t) // parallel: other tests' namespaces are not ours to write
	lease := cluster.Namespace(t, "lineage-lease")
	apps := trustNamespace(t, "lineage-apps", lbls)
	publish := []string{"--publish-root-cert-configmaps", "--trust-lease-namespace", lease, "--trust-namespace-selector", sel.String()}
	first := startServer(t, publish...)
	firstPEM := waitBundle(t, apps, "", 20*time.Second)
	first.Stop()

	second := harness.StartMeshca(t, bin, append([]string{"--state-dir", t.TempDir(), "--kubeconfig", cluster.Kubeconfig}, publish...)...)
	if !second.WaitForLog(20*time.Second, "belongs to another CA state") || !second.WaitForLog(15*time.Second, "stepped down") {
		t.Fatalf("the replica of another lineage did not say why it does not publish, or did not step down:\n%s", second.Logs())
	}
	time.Sleep(time.Second)
	if got := waitConfigMap(t, apps).Data[trust.DataKey]; got != firstPEM {
		t.Fatal("the replica of another lineage replaced the published bundle")
	}
	unrecord(t, lease, trust.AnnotationLineage, trust.AnnotationSequence)
	// It campaigns again after serve.StepDownBackoff (30 s).
	if got := waitBundle(t, apps, firstPEM, 50*time.Second); got == firstPEM {
		t.Fatal("the bundle did not change")
	}
}

// unrecord removes annotations from the trust publishers' Lease in ns, as
// `kubectl annotate lease -n <ns> meshca-trust-publisher <key>-` does.
func unrecord(t *testing.T, ns string, keys ...string) {
	t.Helper()
	ctx := context.Background()
	l, err := cluster.Client.CoordinationV1().Leases(ns).Get(ctx, "meshca-trust-publisher", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		delete(l.Annotations, k)
	}
	if _, err := cluster.Client.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitConfigMap returns the trust bundle ConfigMap of ns once it exists.
func waitConfigMap(t *testing.T, ns string) *corev1.ConfigMap {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		cm, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), trust.ConfigMapName, metav1.GetOptions{})
		if err == nil {
			if cm.Annotations == nil {
				cm.Annotations = map[string]string{}
			}
			return cm
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in %s: %v", trust.ConfigMapName, ns, err)
		}
	}
}

// waitBundle returns the bundle published in ns once it differs from not.
func waitBundle(t *testing.T, ns, not string, within time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		cm, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), trust.ConfigMapName, metav1.GetOptions{})
		if err == nil && cm.Data[trust.DataKey] != "" && cm.Data[trust.DataKey] != not {
			return cm.Data[trust.DataKey]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s did not change within %v", trust.ConfigMapName, ns, within)
		}
	}
}
