package chart

import (
	"bytes"
	"context"
	"crypto/x509"
	"os/exec"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// checkIstio: Istio mode turns on istiod's certificate, the root and CRL
// ConfigMaps together: the flags, the empty Secret the keeper fills, its
// Role (that Secret alone), the Lease, and the rotation Jobs' guard.
func checkIstio(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	c := deployment(t, objs).Spec.Template.Spec.Containers[0]
	wantArgs(t, "serve", c.Args, []string{"--istiod-cert-secret=" + ns + "/istiod-tls", "--istiod-revision=canary", "--istiod-cert-ttl=24h",
		"--istiod-deployment=istiod-canary", "--publish-root-cert-configmaps", "--publish-crl"}, []string{"--istiod-cert-dns-names"})
	s := find(t, objs, "Secret", "istiod-tls")
	if s.Object["type"] != string(corev1.SecretTypeOpaque) || s.Object["data"] != nil || s.GetAnnotations()["helm.sh/resource-policy"] != "keep" ||
		s.GetAnnotations()[istiodcert.AnnotationOwner] != ns+"/meshca-istiod-cert" {
		t.Errorf("istiod-tls %v: want an empty Secret, kept on uninstall, marked as the keeper's", s.Object)
	}
	find(t, objs, "ValidatingAdmissionPolicy", "meshca."+ns+".istiod-restart.meshca.io")
	wantRules(t, "Role meshca-istiod-cert", role(t, objs, "meshca-istiod-cert").Rules, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"istiod-tls"}, Verbs: []string{"get", "list", "watch", "update"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, ResourceNames: []string{"istiod-canary"}, Verbs: []string{"get", "patch"}},
	})
	wantRules(t, "Role meshca-root-rotation-istiod-cert", role(t, objs, "meshca-root-rotation-istiod-cert").Rules, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"istiod-tls"}, Verbs: []string{"get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, ResourceNames: []string{"istiod-canary"}, Verbs: []string{"get"}},
	})
	if r := role(t, objs, "meshca").Rules; len(r) < 2 || !slices.Contains(r[1].ResourceNames, "meshca-istiod-cert") || !slices.Contains(r[1].ResourceNames, "meshca-trust-publisher") {
		t.Errorf("Role meshca %+v: want the Leases meshca-istiod-cert and meshca-trust-publisher", r)
	}
	checkClusterRole(t, clusterRole(t, objs), []string{"tokenreviews", "pods", "configmaps", "configmaps", "namespaces"})
	if r := clusterRole(t, objs).Rules[2]; !slices.Equal(r.ResourceNames, []string{"istio-ca-root-cert", "istio-ca-crl"}) {
		t.Errorf("ClusterRole's ConfigMaps %q, want istio-ca-root-cert and istio-ca-crl", r.ResourceNames)
	}
	for _, step := range []string{"retire", "activate"} {
		wantArgs(t, step, cronJob(t, objs, step).Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args,
			[]string{"--istiod-cert-secret=" + ns + "/istiod-tls"}, nil)
	}
}

// TestChartIstioInstall applies the Istio mode's rendering for real and
// runs meshca with the Deployment's arguments under its ServiceAccount:
// it fills istiod's Secret, whose certificate verifies against the roots
// it publishes in istio-ca-root-cert, under an account that can read no
// other Secret of istiod's namespace, and marks istiod's Deployment with
// the roots it must start with; the rotation Jobs' commands, under
// theirs, read both for their guards.
func TestChartIstioInstall(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "meshca-istio")
	objs := render(t, ns, "--values", harness.ChartDir()+"/ci/istio-values.yaml")
	apply(t, objs, false)
	istiod := istiodDeployment(t, ns, "istiod-canary")
	ctr := deployment(t, objs).Spec.Template.Spec.Containers[0]
	kubeconfig := cluster.ServiceAccountKubeconfig(t, ns, "meshca")
	m := harness.StartMeshca(t, bin, append(containerArgs(t, ctr, ns), "--kubeconfig", kubeconfig)...)

	var held *istiodcert.Held
	waitFor(t, "istiod-tls filled", func() bool {
		s, err := cluster.Client.CoreV1().Secrets(ns).Get(ctx, "istiod-tls", metav1.GetOptions{})
		if err != nil {
			return false
		}
		held = istiodcert.Parse(s)
		return held.Leaf() != nil
	})
	wantNames := []string{"istiod." + ns + ".svc", "istiod-canary." + ns + ".svc"}
	if leaf := held.Leaf(); !slices.Equal(slices.Sorted(slices.Values(leaf.DNSNames)), slices.Sorted(slices.Values(wantNames))) || !held.KeyMatches {
		t.Fatalf("istiod's certificate names %v (key matches: %v), want %v", leaf.DNSNames, held.KeyMatches, wantNames)
	}
	var roots []*x509.Certificate
	waitFor(t, "istio-ca-root-cert in "+ns, func() bool {
		cm, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, trust.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		roots, err = pemutil.ParseCertificates([]byte(cm.Data[trust.DataKey]))
		return err == nil
	})
	want := keymgr.Fingerprint(roots[0])
	waitFor(t, "istiod's Deployment marked with the root it must start with", func() bool {
		d, err := cluster.Client.AppsV1().Deployments(ns).Get(ctx, istiod, metav1.GetOptions{})
		return err == nil && d.Spec.Template.Annotations[istiodcert.AnnotationTrustedRoots] == want
	})
	t.Run("configmaps", func(t *testing.T) {
		checkConfigMapAccess(t, kubeconfig, ns, string(pemutil.EncodeCertificates(roots...)))
	})
	t.Run("crl configmaps", func(t *testing.T) { checkCRLAccess(t, kubeconfig, ns) })
	for _, name := range wantNames {
		if _, err := held.Leaf().Verify(x509.VerifyOptions{DNSName: name, Roots: certs.Pool(roots...), Intermediates: certs.Pool(held.Chain[1:]...)}); err != nil {
			t.Errorf("istiod's certificate does not verify for %s against istio-ca-root-cert: %v", name, err)
		}
	}

	sa := harness.ClientOf(t, kubeconfig)
	if _, err := sa.CoreV1().Secrets(ns).Get(ctx, "meshca-ca-state", metav1.GetOptions{}); err != nil {
		t.Errorf("meshca cannot read its CA state: %v", err)
	}
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-secret", Namespace: ns}}
	if _, err := cluster.Client.CoreV1().Secrets(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, denied := range []func() error{
		func() error {
			_, err := sa.CoreV1().Secrets(ns).Get(ctx, "istio-ca-secret", metav1.GetOptions{})
			return err
		},
		func() error { _, err := sa.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); return err },
		func() error {
			_, err := sa.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		},
		func() error { return sa.CoreV1().Secrets(ns).Delete(ctx, "istiod-tls", metav1.DeleteOptions{}) },
	} {
		if err := denied(); err == nil || !strings.Contains(err.Error(), "forbidden") {
			t.Errorf("meshca's account reached another Secret, or deleted istiod's: %v", err)
		}
	}

	// The rotation Jobs read istiod's certificate for their guards.
	jobKubeconfig := cluster.ServiceAccountKubeconfig(t, ns, "meshca-root-rotation")
	args := append(slices.Clone(cronJob(t, objs, "activate").Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args), "--kubeconfig", jobKubeconfig)
	var out bytes.Buffer
	cmd := exec.Command(bin, "root", "status", "--state-secret", ns+"/meshca-ca-state", "--istiod-cert-secret", ns+"/istiod-tls", "--kubeconfig", jobKubeconfig)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil || !strings.Contains(out.String(), "istiod's certificate ("+ns+"/istiod-tls): istiod") ||
		!strings.Contains(out.String(), "verifies against the bundle") ||
		!strings.Contains(out.String(), "istiod (Deployment "+ns+"/istiod-canary) starts with the roots of ") {
		t.Errorf("meshca root status as the rotation Job: %v\n%s", err, out.String())
	}
	out.Reset()
	cmd = exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err == nil || !strings.Contains(out.String(), "no prepared authority") || strings.Contains(out.String(), "forbidden") {
		t.Errorf("the activate Job's command: %v\n%s", err, out.String())
	}
	if logs := m.Logs(); strings.Contains(logs, "forbidden") || strings.Contains(logs, "not written") {
		t.Errorf("meshca was refused a request:\n%s", logs)
	}
}

// istiodDeployment creates a Deployment standing for istiod's (no
// controller runs here: only the object meshca patches) and returns its
// name.
func istiodDeployment(t *testing.T, ns, name string) string {
	t.Helper()
	labels := map[string]string{"app": "istiod"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "discovery", Image: "istio/pilot"}}},
			},
		},
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(context.Background(), d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}
