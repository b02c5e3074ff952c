package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// istiodChecks are the matrix's rows for istiod's certificate and
// restart (issue 28, items 4 and 6), each with a meshca or a chart
// rendering of its own: an operator's typo or another owner's Secret must
// never cost a CA key or another's certificate, and meshca's account must
// not be able to change what istiod runs.
func istiodChecks(*testing.T) []check {
	return []check{
		{name: "istiod/cert-manager's istiod-tls refused, readiness and metric say whose", defence: "istiod:foreign_secret_refused",
			run: func(t *testing.T) { refuseCertManagerSecret(t) }},
		{name: "istiod/another owner's Secret adopted only when handed over", defence: "istiod:explicit_adoption",
			run: func(t *testing.T) { refuseCertManagerSecret(t).adopt(t) }},
		{name: "istiod/--istiod-cert-secret is --state-secret", defence: "istiod:state_secret_name_refused", run: checkStateSecretNameRefused},
		{name: "istiod/istiodCertSecret is Istio's cacerts in the config file", defence: "istiod:ca_secret_name_refused", run: checkCacertsNameRefused},
		{name: "istiod/another meshca's CA state named as istiod's Secret, even handed over", defence: "istiod:ca_key_never_written",
			run: checkCAStateNeverWritten},
		{name: "istiod/the chart refuses the CA state's Secret as istiod's", defence: "chart:istiod_secret_name_refused", run: checkChartRefusesStateName},
		{name: "istiod/meshca's account changes istiod's image", defence: "istiod:restart_admission_policy", run: checkRestartPolicy},
	}
}

// checkChartRefusesStateName: helm template with istio's certificate in
// the CA state's Secret fails, naming both values.
func checkChartRefusesStateName(t *testing.T) {
	helm, err := harness.HelmBinary()
	if err != nil {
		t.Fatal(err)
	}
	_, err = harness.HelmTemplate(helm, "meshca", "istio-system", "--set", "istio.enabled=true", "--set", "istio.istiodCertificate.secretName=meshca-ca-state")
	if err == nil || !strings.Contains(err.Error(), "istio.istiodCertificate.secretName (meshca-ca-state) is the CA state's Secret (state.secret.name)") {
		t.Fatalf("helm template: %v", err)
	}
}

// checkRestartPolicy applies the chart's Istio mode in a namespace of
// its own and, as meshca's ServiceAccount, asks to change istiod's image:
// the real apiserver refuses it (the chart's ValidatingAdmissionPolicy),
// and lets the keeper's restart through.
func checkRestartPolicy(t *testing.T) {
	ctx := context.Background()
	helm, err := harness.HelmBinary()
	if err != nil {
		t.Fatal(err)
	}
	ns := cluster.Namespace(t, "attack-istiod-restart")
	data, err := harness.HelmTemplate(helm, "meshca", ns, "--set", "istio.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := harness.Objects(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Apply(ctx, objs, false); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "istiod"}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "istiod"},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec:       corev1.PodSpec{ServiceAccountName: "istiod", Containers: []corev1.Container{{Name: "discovery", Image: "istio/pilot"}}}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := harness.ClientOf(t, cluster.ServiceAccountKubeconfig(t, ns, "meshca"))
	image := []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"discovery","image":"evil.example/pilot"}]}}}}`)
	patch := func(p []byte, opts metav1.PatchOptions) error {
		_, err := sa.AppsV1().Deployments(ns).Patch(ctx, "istiod", types.StrategicMergePatchType, p, opts)
		return err
	}
	waitUntil(t, "the admission policy enforced", 30*time.Second, func() bool {
		err := patch(image, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy")
	})
	if err := patch(image, metav1.PatchOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "not istiod's Pod spec") {
		t.Fatalf("meshca's account changed istiod's image: %v", err)
	}
	if err := patch(istiodcert.RestartPatch([]string{keymgr.Fingerprint(testca.NewRoot(t, "r", testca.Options{}).Cert)}), metav1.PatchOptions{}); err != nil {
		t.Fatalf("the keeper's restart was refused: %v", err)
	}
	checkImage(t, sa, ns)
}

// checkImage: istiod still runs its own image.
func checkImage(t *testing.T, c kubernetes.Interface, ns string) {
	t.Helper()
	d, err := c.AppsV1().Deployments(ns).Get(context.Background(), "istiod", metav1.GetOptions{})
	if err != nil || d.Spec.Template.Spec.Containers[0].Image != "istio/pilot" {
		t.Fatalf("istiod's image: %v", err)
	}
}
