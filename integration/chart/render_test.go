package chart

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// TestChartLint: helm lint --strict passes the defaults and every
// scenario's values.
func TestChartLint(t *testing.T) {
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			out, err := harness.Helm(helm, append([]string{"lint", "--strict", harness.ChartDir()}, s.args()...)...)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(out), "1 chart(s) linted, 0 chart(s) failed") {
				t.Errorf("helm lint --strict:\n%s", out)
			}
		})
	}
}

// TestChartScenarios renders every scenario, checks what it must say, and
// applies every object with server-side dry run: the apiserver validates
// and admits each one (for the Prometheus Operator kinds, against
// test-only CRDs declaring the fields the chart uses).
func TestChartScenarios(t *testing.T) {
	installCRDs(t, "monitoring-crds.yaml")
	ns := cluster.Namespace(t, "chart-dry-run")
	// Remote-cluster Secrets have a namespace of their own, which the dry
	// run of their Role needs to exist.
	remoteNS := cluster.Namespace(t, "chart-remote-secrets")
	checks := map[string]func(*testing.T, string, []*unstructured.Unstructured){
		"defaults":               checkDefaults,
		"ha":                     checkHA,
		"vault":                  checkVault,
		"cfssl":                  checkCfssl,
		"k8scsr":                 checkK8sCSR,
		"scheduling":             checkScheduling,
		"monitoring":             checkMonitoring,
		"istio":                  checkIstio,
		"serve-config":           checkServeConfig,
		"upstream":               checkUpstream,
		"vault-pki-upstream":     checkVaultPKIUpstream,
		"vault-transit-upstream": checkVaultTransitUpstream,
		"pkcs11":                 checkPKCS11,
	}
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			objs := render(t, ns, append(s.args(), "--set", "multiCluster.remoteSecrets.namespace="+remoteNS)...)
			for _, o := range objs {
				remote := o.GetNamespace() == remoteNS && o.GetName() == "meshca-remote-secrets"
				if namespaced(o.GetKind()) && o.GetNamespace() != ns && !remote {
					t.Errorf("%s %s is in namespace %q, not the release's", o.GetKind(), o.GetName(), o.GetNamespace())
				}
			}
			checkPodSecurity(t, objs)
			checkPodSelectors(t, objs)
			checks[s.name](t, ns, objs)
			apply(t, objs, true)
		})
	}
}

// TestChartDryRunRefusesMistakes: the dry run is a real check, not a
// formality: a rendered object with an unknown field or a bad value is
// refused with the apiserver's own message.
func TestChartDryRunRefusesMistakes(t *testing.T) {
	ns := cluster.Namespace(t, "chart-mistakes")
	tests := []struct {
		name   string
		break_ func(*unstructured.Unstructured) error
		want   string
	}{
		{"unknown field", func(d *unstructured.Unstructured) error {
			return unstructured.SetNestedField(d.Object, "x", "spec", "template", "spec", "hostNetworking")
		}, `.spec.template.spec.hostNetworking: field not declared in schema`},
		{"negative replicas", func(d *unstructured.Unstructured) error {
			return unstructured.SetNestedField(d.Object, int64(-1), "spec", "replicas")
		}, `spec.replicas: Invalid value: -1: must be greater than or equal to 0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := find(t, render(t, ns), "Deployment", "meshca")
			if err := tt.break_(d); err != nil {
				t.Fatal(err)
			}
			err := cluster.Apply(context.Background(), []*unstructured.Unstructured{d}, true)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("dry run: %v, want %q", err, tt.want)
			}
		})
	}
}

// installCRDs creates the CRDs of a testdata file and waits until the
// apiserver serves them.
func installCRDs(t *testing.T, file string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := harness.Objects(data)
	if err != nil {
		t.Fatal(err)
	}
	apply(t, objs, false)
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, o := range objs {
		for deadline := time.Now().Add(30 * time.Second); !established(crds, o.GetName()); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("CRD %s not established within 30s", o.GetName())
			}
		}
	}
}

func established(crds dynamic.NamespaceableResourceInterface, name string) bool {
	got, err := crds.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// convert turns a rendered object into its typed form.
func convert(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

func namespaced(kind string) bool {
	return !slices.Contains([]string{"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Namespace",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}, kind)
}

// kinds counts the rendered objects by kind.
func kinds(objs []*unstructured.Unstructured) map[string]int {
	m := map[string]int{}
	for _, o := range objs {
		m[o.GetKind()]++
	}
	return m
}

func deployment(t *testing.T, objs []*unstructured.Unstructured) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	convert(t, find(t, objs, "Deployment", "meshca"), &d)
	return &d
}

func cronJob(t *testing.T, objs []*unstructured.Unstructured, step string) *batchv1.CronJob {
	t.Helper()
	var c batchv1.CronJob
	convert(t, find(t, objs, "CronJob", "meshca-root-"+step), &c)
	return &c
}

func clusterRole(t *testing.T, objs []*unstructured.Unstructured) *rbacv1.ClusterRole {
	t.Helper()
	var r rbacv1.ClusterRole
	convert(t, find(t, objs, "ClusterRole", "meshca"), &r)
	return &r
}

func role(t *testing.T, objs []*unstructured.Unstructured, name string) *rbacv1.Role {
	t.Helper()
	var r rbacv1.Role
	convert(t, find(t, objs, "Role", name), &r)
	return &r
}

func pdb(t *testing.T, objs []*unstructured.Unstructured) *policyv1.PodDisruptionBudget {
	t.Helper()
	var p policyv1.PodDisruptionBudget
	convert(t, find(t, objs, "PodDisruptionBudget", "meshca"), &p)
	return &p
}

// wantArgs checks that args hold every one of want and none of notWant.
func wantArgs(t *testing.T, what string, args, want, notWant []string) {
	t.Helper()
	for _, a := range want {
		if !slices.Contains(args, a) {
			t.Errorf("%s: no argument %q in %q", what, a, args)
		}
	}
	for _, a := range notWant {
		if slices.ContainsFunc(args, func(s string) bool { return strings.HasPrefix(s, a) }) {
			t.Errorf("%s: argument %q should not be in %q", what, a, args)
		}
	}
}

// checkPodSecurity: every Pod the chart makes runs hardened, and takes no
// value from a literal environment variable (credentials come from
// Secrets, mounted as files).
func checkPodSecurity(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	var specs []corev1.PodSpec
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			specs = append(specs, deployment(t, objs).Spec.Template.Spec)
		case "CronJob":
			var c batchv1.CronJob
			convert(t, o, &c)
			specs = append(specs, c.Spec.JobTemplate.Spec.Template.Spec)
		}
	}
	for _, p := range specs {
		sc := p.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("pod security context %+v: want runAsNonRoot and seccomp RuntimeDefault", sc)
		}
		for _, c := range p.Containers {
			cs := c.SecurityContext
			if cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation || cs.ReadOnlyRootFilesystem == nil ||
				!*cs.ReadOnlyRootFilesystem || cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("container %s security context %+v: want no privilege escalation, read-only root, all capabilities dropped", c.Name, cs)
			}
			for _, e := range c.Env {
				if e.Value != "" {
					t.Errorf("container %s: environment variable %s has a literal value", c.Name, e.Name)
				}
			}
		}
	}
}
