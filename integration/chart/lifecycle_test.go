package chart

import (
	"context"
	"maps"
	"strings"
	"testing"

	"github.com/meshca/meshca/integration/harness"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestChartLifecycle runs the real helm against the real apiserver:
// install, meshca filling the CA state Secret under the chart's RBAC, an
// upgrade, an uninstall and a reinstall. The CA state survives each, as
// meshca wrote it: no upgrade conflicts with meshca's writes to it (helm
// applies server-side), and uninstall keeps it.
func TestChartLifecycle(t *testing.T) {
	ns := cluster.Namespace(t, "chart-lifecycle")
	const release = "lifecycle"
	helmIn := func(args ...string) string {
		t.Helper()
		out, err := harness.Helm(helm, append(args, "--namespace", ns, "--kubeconfig", cluster.Kubeconfig)...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	t.Cleanup(func() {
		_, _ = harness.Helm(helm, "uninstall", release, "--namespace", ns, "--kubeconfig", cluster.Kubeconfig)
	})

	helmIn("install", release, harness.ChartDir())
	out, err := harness.HelmTemplate(helm, release, ns)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := harness.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	convert(t, find(t, objs, "Deployment", "lifecycle-meshca"), &d)
	args := containerArgs(t, d.Spec.Template.Spec.Containers[0], ns)
	m := harness.StartMeshca(t, bin, append(args, "--kubeconfig", cluster.ServiceAccountKubeconfig(t, ns, "lifecycle-meshca"))...)
	m.Stop()
	written := stateData(t, ns)
	if len(written) == 0 {
		t.Fatalf("meshca did not fill the state Secret:\n%s", m.Logs())
	}

	steps := []struct {
		name string
		args []string
		want string
	}{
		{"upgrade", []string{"upgrade", release, harness.ChartDir(), "--set", "replicaCount=3"}, "has been upgraded"},
		{"upgrade again", []string{"upgrade", release, harness.ChartDir()}, "has been upgraded"},
		{"uninstall", []string{"uninstall", release}, "uninstalled"},
		{"reinstall", []string{"install", release, harness.ChartDir()}, "STATUS: deployed"},
	}
	for _, s := range steps {
		if out := helmIn(s.args...); !strings.Contains(out, s.want) {
			t.Errorf("helm %s: %q not in\n%s", s.name, s.want, out)
		}
		if got := stateData(t, ns); !maps.EqualFunc(got, written, func(a, b string) bool { return a == b }) {
			t.Fatalf("after helm %s the CA state Secret holds %d entries, not what meshca wrote", s.name, len(got))
		}
	}
}

// stateData is the data of the lifecycle release's state Secret, as
// strings, nil when there is none.
func stateData(t *testing.T, ns string) map[string]string {
	t.Helper()
	sec, err := cluster.Client.CoreV1().Secrets(ns).Get(context.Background(), "lifecycle-meshca-ca-state", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("state Secret: %v", err)
	}
	m := map[string]string{}
	for k, v := range sec.Data {
		m[k] = string(v)
	}
	return m
}
