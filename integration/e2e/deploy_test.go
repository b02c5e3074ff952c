package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestManifestsRBAC applies deploy/manifests (the Helm chart's defaults,
// release meshca in istio-system) to the real apiserver and runs meshca
// with the credentials of the ServiceAccount they create: its RBAC must be
// enough to review tokens and issue. integration/chart checks the
// rendering itself, every verb, and the Deployment's own arguments.
func TestManifestsRBAC(t *testing.T) {
	ctx := context.Background()
	data, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "deploy", "manifests", "meshca.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	applyYAML(t, data)

	s := startServerAs(t, cluster.ServiceAccountKubeconfig(t, "istio-system", "meshca"))
	w := cluster.NewWorkload(t, cluster.Namespace(t, "rbac"), "frontend", "node-a")
	if _, err := s.client(t, w.Token).Fetch(ctx, workloadID(w), caclient.Options{}); err != nil {
		t.Fatalf("meshca running as its ServiceAccount could not issue: %v", err)
	}
}

// applyChart renders the chart as release meshca in istio-system, with
// more helm flags (--set), and applies it: the objects become exactly that
// rendering, whatever an earlier test applied.
func applyChart(t *testing.T, args ...string) {
	t.Helper()
	helm, err := harness.HelmBinary()
	if err != nil {
		t.Fatal(err)
	}
	data, err := harness.HelmTemplate(helm, "meshca", "istio-system", args...)
	if err != nil {
		t.Fatal(err)
	}
	applyYAML(t, data)
}

// applyYAML server-side applies every object of a multi-document YAML
// stream in istio-system.
func applyYAML(t *testing.T, data []byte) {
	t.Helper()
	ctx := context.Background()
	if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	objs, err := harness.Objects(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Apply(ctx, objs, false); err != nil {
		t.Fatal(err)
	}
}
