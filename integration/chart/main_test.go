// Package chart validates meshca's Helm chart with the real tools: helm
// lint and template for every scenario, the values schema's refusals,
// server-side dry run of every rendered object against a real
// kube-apiserver, and the default install applied for real with meshca
// running under its ServiceAccount's RBAC.
package chart

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshca/meshca/integration/harness"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

var (
	cluster *harness.Cluster
	bin     string // meshca
	helm    string
)

func TestMain(m *testing.M) {
	var err error
	if helm, err = harness.HelmBinary(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the real helm is required for these tests:", err)
		os.Exit(1)
	}
	os.Exit(harness.Main(m, func(c *harness.Cluster, meshca string) { cluster, bin = c, meshca }))
}

// scenario is a values file of the chart's ci/ folder, or the defaults.
type scenario struct {
	name   string
	values string // file under ci/; empty: the defaults
}

func (s scenario) args() []string {
	if s.values == "" {
		return nil
	}
	return []string{"--values", filepath.Join(harness.ChartDir(), "ci", s.values)}
}

// scenarios are what the chart is rendered, linted and dry-run for.
var scenarios = []scenario{
	{"defaults", ""},
	{"ha", "ha-values.yaml"},
	{"vault", "vault-values.yaml"},
	{"cfssl", "cfssl-values.yaml"},
	{"k8scsr", "k8scsr-values.yaml"},
	{"scheduling", "scheduling-values.yaml"},
	{"monitoring", "monitoring-values.yaml"},
	{"istio", "istio-values.yaml"},
	{"serve-config", "serveconfig-values.yaml"},
	{"upstream", "upstream-values.yaml"},
	{"vault-pki-upstream", "vault-pki-upstream-values.yaml"},
	{"vault-transit-upstream", "vault-transit-upstream-values.yaml"},
	{"pkcs11", "pkcs11-values.yaml"},
}

// render runs helm template for release meshca in namespace ns.
func render(t *testing.T, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := harness.HelmTemplate(helm, "meshca", ns, args...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := harness.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// apply applies objs for real, or with server-side dry run.
func apply(t *testing.T, objs []*unstructured.Unstructured, dryRun bool) {
	t.Helper()
	if err := cluster.Apply(context.Background(), objs, dryRun); err != nil {
		t.Fatal(err)
	}
}

// find returns the rendered object of kind and name, failing without one.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}
