package chart

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartDefaultInstall applies the default rendering for real, then:
// the apiserver's authorizer answers yes for every request meshca and the
// rotation Jobs make and no for a sample they must not; meshca, run with
// the Deployment's own arguments under its ServiceAccount's token, stores
// its root in the chart's Secret, issues an SVID and holds its Lease, and,
// beside an istiod that runs its own CA, replaces no istio-ca-root-cert
// (its account may not touch one); the CronJobs' commands, under theirs,
// take their steps or say why not with the exit codes the Job's
// podFailurePolicy reads.
func TestChartDefaultInstall(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "meshca-chart")
	objs := render(t, ns)
	apply(t, objs, false)

	t.Run("rbac", func(t *testing.T) { checkAccess(t, ns) })
	ctr := deployment(t, objs).Spec.Template.Spec.Containers[0]
	if ctr.Args[0] != "serve" {
		t.Fatalf("Deployment args %q do not start with serve", ctr.Args)
	}
	args := containerArgs(t, ctr, ns)
	if !slices.Contains(args, "--memory-limit=268435456") {
		t.Errorf("args %q: want the container's memory limit (256Mi) in bytes", args)
	}
	kubeconfig := cluster.ServiceAccountKubeconfig(t, ns, "meshca")
	m := harness.StartMeshca(t, bin, append(args, "--kubeconfig", kubeconfig)...)
	if !strings.Contains(m.Logs(), `"soft_limit_bytes":241591910`) {
		t.Errorf("meshca did not set Go's soft memory limit to 90%% of 256Mi:\n%s", m.Logs())
	}

	state := ns + "/meshca-ca-state"
	out, err := exec.Command(bin, "root", "bundle", "--state-secret", state, "--kubeconfig", cluster.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("meshca root bundle: %v", err)
	}
	roots, err := pemutil.ParseCertificates(out)
	if err != nil || len(roots) != 1 {
		t.Fatalf("the state Secret's bundle: %d roots, %v", len(roots), err)
	}
	sec, err := cluster.Client.CoreV1().Secrets(ns).Get(ctx, "meshca-ca-state", metav1.GetOptions{})
	if err != nil || len(sec.Data) == 0 || sec.Labels["app.kubernetes.io/managed-by"] != "" {
		t.Fatalf("state Secret after start: %v %v, want meshca's data and no managed-by label (the chart made it)", sec, err)
	}

	apps := cluster.Namespace(t, "chart-apps")
	// istiod's own root, as its namespace controller publishes it.
	istiodRoot := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: apps},
		Data: map[string]string{trust.DataKey: "istiod's root"}}
	if _, err := cluster.Client.CoreV1().ConfigMaps(apps).Create(ctx, istiodRoot, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := cluster.NewWorkload(t, apps, "frontend", "node-a")
	c, err := checked.NewClient(t, caclient.Config{Addr: m.Addr, ServerName: "meshca." + ns + ".svc", Roots: certs.Pool(roots...),
		ClusterID: "Kubernetes", TokenFile: harness.WriteToken(t, w.Token)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id := spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", apps, "sa", "frontend")
	if _, err := c.Fetch(ctx, id, caclient.Options{}); err != nil {
		t.Fatalf("meshca under the chart's RBAC could not issue: %v\n%s", err, m.Logs())
	}
	waitFor(t, "Lease meshca-root-rotator held", func() bool {
		l, err := cluster.Client.CoordinationV1().Leases(ns).Get(ctx, "meshca-root-rotator", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
	})
	// A trust publisher would have written within a second of leading.
	time.Sleep(2 * time.Second)
	cm, err := cluster.Client.CoreV1().ConfigMaps(apps).Get(ctx, trust.ConfigMapName, metav1.GetOptions{})
	if err != nil || cm.Data[trust.DataKey] != "istiod's root" || len(cm.Data) != 1 {
		t.Errorf("istiod's istio-ca-root-cert after meshca started with the chart's defaults: %v %v, want it untouched", cm.Data, err)
	}
	if _, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, trust.ConfigMapName, metav1.GetOptions{}); err == nil {
		t.Errorf("meshca created istio-ca-root-cert in %s with the chart's defaults", ns)
	}
	if logs := m.Logs(); strings.Contains(logs, "forbidden") || strings.Contains(logs, "not allowed") {
		t.Errorf("meshca was refused a request:\n%s", logs)
	}

	t.Run("rotation", func(t *testing.T) { checkRotationJobs(t, objs, state) })
}

// checkAccess asks the authorizer about meshca's and the rotation Jobs'
// requests: those they make must be allowed, the sample of others denied.
func checkAccess(t *testing.T, ns string) {
	const (
		core  = ""
		coord = "coordination.k8s.io"
		certs = "certificates.k8s.io"
	)
	tests := []struct {
		sa      string
		a       harness.Access
		allowed bool
	}{
		{"meshca", harness.Access{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"}, true},
		{"meshca", harness.Access{Verb: "get", Resource: "pods", Namespace: "any-app"}, true},
		{"meshca", harness.Access{Verb: "list", Resource: "pods"}, true},
		{"meshca", harness.Access{Verb: "watch", Resource: "pods"}, true},
		{"meshca", harness.Access{Verb: "create", Group: coord, Resource: "leases", Namespace: ns}, true},
		{"meshca", harness.Access{Verb: "update", Group: coord, Resource: "leases", Namespace: ns, Name: "meshca-root-rotator"}, true},
		{"meshca", harness.Access{Verb: "get", Resource: "secrets", Namespace: ns, Name: "meshca-ca-state"}, true},
		{"meshca", harness.Access{Verb: "update", Resource: "secrets", Namespace: ns, Name: "meshca-ca-state"}, true},
		{"meshca-root-rotation", harness.Access{Verb: "get", Resource: "secrets", Namespace: ns, Name: "meshca-ca-state"}, true},
		{"meshca-root-rotation", harness.Access{Verb: "update", Resource: "secrets", Namespace: ns, Name: "meshca-ca-state"}, true},

		// The defaults publish nothing of Istio's: istiod's namespace
		// controller owns istio-ca-root-cert (istio.enabled hands it over).
		{"meshca", harness.Access{Verb: "list", Resource: "namespaces"}, false},
		{"meshca", harness.Access{Verb: "list", Resource: "configmaps", Name: "istio-ca-root-cert"}, false},
		{"meshca", harness.Access{Verb: "update", Resource: "configmaps", Namespace: "any-app", Name: "istio-ca-root-cert"}, false},
		{"meshca", harness.Access{Verb: "update", Resource: "configmaps", Namespace: "any-app", Name: "istio-ca-crl"}, false},
		{"meshca", harness.Access{Verb: "create", Resource: "configmaps", Namespace: "any-app"}, false},
		{"meshca", harness.Access{Verb: "get", Group: coord, Resource: "leases", Namespace: ns, Name: "meshca-trust-publisher"}, false},
		{"meshca", harness.Access{Verb: "get", Resource: "secrets", Namespace: ns, Name: "istiod-tls"}, false},
		{"meshca", harness.Access{Verb: "create", Resource: "secrets", Namespace: ns}, false},
		{"meshca", harness.Access{Verb: "list", Resource: "secrets", Namespace: ns}, false},
		{"meshca", harness.Access{Verb: "get", Resource: "secrets", Namespace: ns, Name: "cacerts"}, false},
		{"meshca", harness.Access{Verb: "delete", Resource: "secrets", Namespace: ns, Name: "meshca-ca-state"}, false},
		{"meshca", harness.Access{Verb: "get", Resource: "secrets", Namespace: "kube-system", Name: "meshca-ca-state"}, false},
		{"meshca", harness.Access{Verb: "delete", Resource: "configmaps", Namespace: "any-app", Name: "istio-ca-root-cert"}, false},
		{"meshca", harness.Access{Verb: "list", Resource: "configmaps"}, false},
		{"meshca", harness.Access{Verb: "watch", Resource: "configmaps", Namespace: "kube-system"}, false},
		{"meshca", harness.Access{Verb: "get", Resource: "configmaps", Namespace: "kube-system", Name: "coredns"}, false},
		{"meshca", harness.Access{Verb: "update", Resource: "configmaps", Namespace: "kube-system", Name: "coredns"}, false},
		{"meshca", harness.Access{Verb: "get", Resource: "configmaps", Namespace: ns, Name: "meshca-dashboard"}, false},
		{"meshca", harness.Access{Verb: "update", Group: coord, Resource: "leases", Namespace: ns, Name: "kube-scheduler"}, false},
		{"meshca", harness.Access{Verb: "create", Group: coord, Resource: "leases", Namespace: "kube-system"}, false},
		{"meshca", harness.Access{Verb: "create", Resource: "pods", Namespace: ns}, false},
		{"meshca", harness.Access{Verb: "delete", Resource: "pods", Namespace: "any-app"}, false},
		{"meshca", harness.Access{Verb: "update", Resource: "namespaces", Name: "any-app"}, false},
		{"meshca", harness.Access{Verb: "create", Group: certs, Resource: "clustertrustbundles"}, false},
		{"meshca", harness.Access{Verb: "attest", Group: certs, Resource: "signers", Name: "meshca.io/svid"}, false},
		{"meshca", harness.Access{Verb: "create", Group: certs, Resource: "certificatesigningrequests"}, false},
		{"meshca", harness.Access{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenrequests"}, false},
		{"meshca", harness.Access{Verb: "create", Resource: "serviceaccounts/token", Namespace: ns, Name: "meshca"}, false},
		{"meshca", harness.Access{Verb: "impersonate", Resource: "serviceaccounts", Namespace: "istio-system", Name: "ztunnel"}, false},
		{"meshca-root-rotation", harness.Access{Verb: "create", Resource: "secrets", Namespace: ns}, false},
		{"meshca-root-rotation", harness.Access{Verb: "get", Resource: "secrets", Namespace: ns, Name: "other"}, false},
		{"meshca-root-rotation", harness.Access{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"}, false},
		{"meshca-root-rotation", harness.Access{Verb: "list", Resource: "pods"}, false},
		{"meshca-root-rotation", harness.Access{Verb: "update", Group: coord, Resource: "leases", Namespace: ns, Name: "meshca-root-rotator"}, false},
	}
	for _, tt := range tests {
		got, err := cluster.Allowed(context.Background(), ns, tt.sa, tt.a)
		if err != nil {
			t.Fatal(err)
		}
		if got != tt.allowed {
			t.Errorf("%s: %s allowed %v, want %v", tt.sa, tt.a, got, tt.allowed)
		}
	}
}

// checkRotationJobs runs the CronJobs' own arguments as the rotation
// ServiceAccount: with one active root there is nothing to retire or
// activate (exit 2, retried up to backoffLimit); once a root is prepared,
// activate's guard refuses (exit 1, the Job fails at once).
func checkRotationJobs(t *testing.T, objs []*unstructured.Unstructured, state string) {
	kubeconfig := cluster.ServiceAccountKubeconfig(t, strings.Split(state, "/")[0], "meshca-root-rotation")
	job := func(step string) []string {
		args := cronJob(t, objs, step).Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args
		return append(slices.Clone(args), "--kubeconfig", kubeconfig)
	}
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"retire with nothing to retire", job("retire"), 2, "no previous authority"},
		{"activate with nothing prepared", job("activate"), 2, "no prepared authority"},
		{"prepare by hand", []string{"root", "prepare", "--state-secret", state, "--kubeconfig", kubeconfig}, 0, "prepared"},
		{"activate too early", job("activate"), 1, "refused"},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		cmd := exec.Command(bin, tt.args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		code := 0
		var ee *exec.ExitError
		if err := cmd.Run(); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tt.code || !strings.Contains(out.String(), tt.want) || strings.Contains(out.String(), "forbidden") {
			t.Errorf("%s: meshca %s: exit %d, want %d saying %q:\n%s", tt.name, strings.Join(tt.args, " "), code, tt.code, tt.want, out.String())
		}
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
	}
}
