package e2e

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
// can lead. With the annotation removed (going back on purpose), it
// writes its bundle when it leads again.
func TestStaleLeaderKeepsNewerBundle(t *testing.T) {
	lease := cluster.Namespace(t, "stale-lease")
	apps := cluster.Namespace(t, "stale-apps")
	publish := []string{"--publish-root-cert-configmaps", "--trust-lease-namespace", lease}
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
	if out, code := rootStep(t, "prepare", "--state-dir="+s.stateDir); code != 0 {
		t.Fatalf("prepare: exit %d\n%s", code, out)
	}
	after := waitRoots(2, 5*time.Second)
	if before == "" || after == "" || before == after {
		t.Fatalf("the ConfigMap's sequence went from %q to %q on prepare, want two different sequences", before, after)
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

	// Going back on purpose (docs/rotation.md): with the annotation
	// removed, as `kubectl annotate configmap -A --field-selector
	// metadata.name=istio-ca-root-cert meshca.io/bundle-sequence-` does
	// (here only from this test's CA, whose lineage the ConfigMap names),
	// the older bundle is written.
	ctx := context.Background()
	ours, err := cluster.Client.CoreV1().ConfigMaps(apps).Get(ctx, trust.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lineage := ours.Annotations[trust.AnnotationLineage]
	cms, err := cluster.Client.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + trust.ConfigMapName})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		if _, ok := cm.Annotations[trust.AnnotationSequence]; !ok || cm.Annotations[trust.AnnotationLineage] != lineage {
			continue
		}
		delete(cm.Annotations, trust.AnnotationSequence)
		if _, err := cluster.Client.CoreV1().ConfigMaps(cm.Namespace).Update(ctx, &cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
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
