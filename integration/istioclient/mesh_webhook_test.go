package istioclient

// istiod's webhooks through the rotations: istiod serves its sidecar
// injection and config validation webhooks with the certificate meshca
// keeps in istiod-tls, and patches their caBundle itself from the roots
// it mounts (istio-ca-root-cert). The real apiserver calls them: it
// reaches istiod through the Service "istiod" of istiod's namespace, an
// ExternalName of localhost (the apiserver resolves a webhook's Service
// to its ClusterIP, or to the external name of an ExternalName Service,
// and verifies the name <service>.<namespace>.svc, as in a cluster), on
// the port of a stand-in Service that forwards to the ready istiod Pod.
// In every phase, and every two seconds between, a Pod is created in a
// namespace labelled istio-injection=enabled and must come back with
// istio-proxy injected, and an invalid Gateway must be refused by istiod.

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
)

const (
	// injectorConfigMap holds istiod's injection templates, in its
	// namespace: istiod serves /inject only when it finds it at start.
	injectorConfigMap = "istio-sidecar-injector"
	// injectorConfig is the smallest template istiod injects: the
	// istio-proxy container, which is what the test looks for.
	injectorConfig = `policy: enabled
defaultTemplates: [sidecar]
templates:
  sidecar: |
    spec:
      containers:
      - name: istio-proxy
        image: example.invalid/proxyv2:1
        args: [proxy, sidecar]
`
	// revisionLabel selects the webhook configurations istiod patches
	// (its revision: "default"), and the objects its validator checks.
	revisionLabel = "istio.io/rev"
	// admitEvery is the pace of the admissions between the phases' own.
	admitEvery = 2 * time.Second
)

var gatewayGVR = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "gateways"}

// admitted is one admission through istiod's webhooks: err is nil when
// it went as it must.
type admitted struct {
	phase string
	at    time.Time
	err   error
}

// webhooks are istiod's webhook configurations and what went through
// them.
type webhooks struct {
	t                  *testing.T
	istiodNS, injectNS string
	mutating, validate string // the configurations' names
	hooks              *service
	dyn                dynamic.Interface

	mu          sync.Mutex
	phase       string
	phases      []string // entered, in order
	seq         int      // of the objects admitted
	injections  []admitted
	validations []admitted
	bundles     []string // each caBundle seen, as its number of roots
	lastBundle  string   // its roots' fingerprints
}

// installWebhooks creates what istiod's webhooks need before istiod's
// first Pod starts: the Gateway CRD (Istio's own), the injection
// templates, the Service the apiserver calls, the namespace whose Pods
// are injected, and the two configurations as Istio's chart installs
// them, without caBundle: istiod patches it.
func installWebhooks(t *testing.T, ctx context.Context, istiodNS string) *webhooks {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	w := &webhooks{t: t, istiodNS: istiodNS, injectNS: cluster.Namespace(t, "mesh-inject"), hooks: startService(t), dyn: dyn,
		mutating: "istio-sidecar-injector-" + istiodNS, validate: "istio-validator-" + istiodNS, phase: "start"}
	installGatewayCRD(t, ctx)
	c := cluster.Client
	ns, err := c.CoreV1().Namespaces().Get(ctx, w.injectNS, metav1.GetOptions{})
	if err == nil {
		ns.Labels = map[string]string{"istio-injection": "enabled"}
		_, err = c.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
	}
	must(t, err)
	cluster.ServiceAccount(t, w.injectNS, "app")
	_, err = c.CoreV1().ConfigMaps(istiodNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: injectorConfigMap},
		Data: map[string]string{"config": injectorConfig, "values": "{}"}}, metav1.CreateOptions{})
	must(t, err)
	_, err = c.CoreV1().Services(istiodNS).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "istiod"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"}}, metav1.CreateOptions{})
	must(t, err)
	w.createConfigurations(ctx)
	return w
}

// installGatewayCRD installs gateways.networking.istio.io from the Istio
// module the test builds against, and waits until it is served.
func installGatewayCRD(t *testing.T, ctx context.Context) {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio").Output()
	if err != nil {
		t.Fatalf("go list -m istio.io/istio: %v", err)
	}
	raw, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "manifests/charts/base/files/crd-all.gen.yaml"))
	must(t, err)
	objs, err := harness.Objects(raw)
	must(t, err)
	var crd []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetName() == gatewayGVR.Resource+"."+gatewayGVR.Group {
			crd = append(crd, o)
		}
	}
	if len(crd) != 1 {
		t.Fatalf("Istio's CRDs hold %d definitions of %s", len(crd), gatewayGVR.GroupResource())
	}
	must(t, cluster.Apply(ctx, crd, false))
	t.Cleanup(func() {
		crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
		dyn, _ := dynamic.NewForConfig(cluster.Config)
		_ = dyn.Resource(crds).Delete(context.Background(), crd[0].GetName(), metav1.DeleteOptions{})
	})
	dyn, err := dynamic.NewForConfig(cluster.Config)
	must(t, err)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := dyn.Resource(gatewayGVR).List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Istio's Gateway CRD not served within 30s: %v", err)
		}
	}
}

// createConfigurations creates the MutatingWebhookConfiguration and the
// ValidatingWebhookConfiguration of Istio's chart for the default
// revision (webhook names, rules, selectors, failure policies), pointing
// at the Service istiod on the stand-in's port.
func (w *webhooks) createConfigurations(ctx context.Context) {
	_, p, _ := strings.Cut(w.hooks.addr(), ":")
	var port int32
	fmt.Sscan(p, &port)
	none, fail, ignore := admissionv1.SideEffectClassNone, admissionv1.Fail, admissionv1.Ignore
	never := admissionv1.NeverReinvocationPolicy
	labels := map[string]string{revisionLabel: "default"}
	svc := func(path string) admissionv1.WebhookClientConfig {
		return admissionv1.WebhookClientConfig{Service: &admissionv1.ServiceReference{Namespace: w.istiodNS, Name: "istiod", Path: &path, Port: &port}}
	}
	admission := cluster.Client.AdmissionregistrationV1()
	_, err := admission.MutatingWebhookConfigurations().Create(ctx, &admissionv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: w.mutating, Labels: labels},
		Webhooks: []admissionv1.MutatingWebhook{{Name: "namespace.sidecar-injector.istio.io", ClientConfig: svc("/inject"),
			Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create},
				Rule: admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"istio-injection": "enabled"}},
			FailurePolicy:     &fail, SideEffects: &none, ReinvocationPolicy: &never, AdmissionReviewVersions: []string{"v1"}}},
	}, metav1.CreateOptions{})
	must(w.t, err)
	_, err = admission.ValidatingWebhookConfigurations().Create(ctx, &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: w.validate, Labels: labels},
		Webhooks: []admissionv1.ValidatingWebhook{{Name: "rev.validation.istio.io", ClientConfig: svc("/validate"),
			Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
				Rule: admissionv1.Rule{APIGroups: []string{"security.istio.io", "networking.istio.io", "telemetry.istio.io", "extensions.istio.io"},
					APIVersions: []string{"*"}, Resources: []string{"*"}}}},
			ObjectSelector: &metav1.LabelSelector{MatchLabels: labels},
			// Open until istiod, having patched caBundle, sees its own
			// dry run refused and closes it (Fail).
			FailurePolicy: &ignore, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}}},
	}, metav1.CreateOptions{})
	must(w.t, err)
	w.t.Cleanup(func() {
		_ = admission.MutatingWebhookConfigurations().Delete(context.Background(), w.mutating, metav1.DeleteOptions{})
		_ = admission.ValidatingWebhookConfigurations().Delete(context.Background(), w.validate, metav1.DeleteOptions{})
	})
}

// caBundles are the roots of both configurations' caBundle now, and
// whether validation fails closed.
func (w *webhooks) caBundles(ctx context.Context) (mutating, validating []*x509.Certificate, closed bool) {
	admission := cluster.Client.AdmissionregistrationV1()
	if mwc, err := admission.MutatingWebhookConfigurations().Get(ctx, w.mutating, metav1.GetOptions{}); err == nil {
		mutating, _ = pemutil.ParseCertificates(mwc.Webhooks[0].ClientConfig.CABundle)
	}
	if vwc, err := admission.ValidatingWebhookConfigurations().Get(ctx, w.validate, metav1.GetOptions{}); err == nil {
		validating, _ = pemutil.ParseCertificates(vwc.Webhooks[0].ClientConfig.CABundle)
		closed = vwc.Webhooks[0].FailurePolicy != nil && *vwc.Webhooks[0].FailurePolicy == admissionv1.Fail
	}
	return mutating, validating, closed
}

// targets are istiod's webhooks as the apiserver dials them on a new
// connection: the name of the Service istiod, verified with the caBundle
// of each configuration at that moment.
func (w *webhooks) targets(ctx context.Context) []probeTarget {
	san := "istiod." + w.istiodNS + ".svc"
	admission := cluster.Client.AdmissionregistrationV1()
	injection := func() ([]*x509.Certificate, error) {
		mwc, err := admission.MutatingWebhookConfigurations().Get(ctx, w.mutating, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return pemutil.ParseCertificates(mwc.Webhooks[0].ClientConfig.CABundle)
	}
	validation := func() ([]*x509.Certificate, error) {
		vwc, err := admission.ValidatingWebhookConfigurations().Get(ctx, w.validate, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return pemutil.ParseCertificates(vwc.Webhooks[0].ClientConfig.CABundle)
	}
	return []probeTarget{
		{name: "the injection webhook's caBundle", addr: w.hooks.addr(), san: san, roots: injection},
		{name: "the validation webhook's caBundle", addr: w.hooks.addr(), san: san, roots: validation},
	}
}

// patched says "" once both caBundles are exactly roots and validation
// fails closed: istiod patched them.
func (w *webhooks) patched(ctx context.Context, roots []*x509.Certificate) string {
	mutating, validating, closed := w.caBundles(ctx)
	w.observe(mutating)
	switch {
	case !sameCerts(mutating, roots):
		return fmt.Sprintf("the injection webhook's caBundle holds %d roots, not the %d istiod mounts", len(mutating), len(roots))
	case !sameCerts(validating, roots):
		return fmt.Sprintf("the validation webhook's caBundle holds %d roots, not the %d istiod mounts", len(validating), len(roots))
	case !closed:
		return "istiod has not closed the validation webhook's failure policy (Fail)"
	}
	return ""
}

func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for _, c := range a {
		if !containsCert(b, c) {
			return false
		}
	}
	return true
}

// run admits a Pod and a Gateway every admitEvery until ctx ends, and
// records each caBundle it sees.
func (w *webhooks) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(admitEvery):
		}
		w.admit(ctx)
		mutating, _, _ := w.caBundles(ctx)
		if ctx.Err() == nil {
			w.observe(mutating)
		}
	}
}

// observe records a caBundle seen, when it differs from the last one.
func (w *webhooks) observe(roots []*x509.Certificate) {
	if len(roots) == 0 {
		return // not patched yet
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var fps []string
	for _, r := range roots {
		fps = append(fps, keymgr.Fingerprint(r))
	}
	if key := strings.Join(fps, ","); key != w.lastBundle {
		w.bundles, w.lastBundle = append(w.bundles, fmt.Sprint(len(roots))), key
	}
}

// enter tags what follows with phase.
func (w *webhooks) enter(phase string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.phase = phase
	w.phases = append(w.phases, phase)
}

// admit creates a Pod, which istiod must inject, and dry-runs an invalid
// Gateway, which istiod must refuse.
func (w *webhooks) admit(ctx context.Context) {
	w.mu.Lock()
	w.seq++
	phase, n := w.phase, w.seq
	w.mu.Unlock()
	injected := w.inject(ctx, n)
	validated := w.refuseInvalid(ctx, n)
	if ctx.Err() != nil {
		return // the test ended: no judgement
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	w.injections = append(w.injections, admitted{phase: phase, at: now, err: injected})
	w.validations = append(w.validations, admitted{phase: phase, at: now, err: validated})
}

// inject creates Pod n and checks that istiod injected istio-proxy.
func (w *webhooks) inject(ctx context.Context, n int) error {
	no := false
	pod, err := cluster.Client.CoreV1().Pods(w.injectNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%d", n)},
		Spec: corev1.PodSpec{ServiceAccountName: "app", AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Pod %s/app-%d: %w", w.injectNS, n, err)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == "istio-proxy" {
			return nil
		}
	}
	return fmt.Errorf("Pod %s/%s created without istio-proxy (containers %d)", w.injectNS, pod.Name, len(pod.Spec.Containers))
}

// refuseInvalid dry-runs the creation of a Gateway whose host is not a
// name: the CRD's schema lets it through, istiod's validation must
// refuse it.
func (w *webhooks) refuseInvalid(ctx context.Context, n int) error {
	gw := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
		"metadata": map[string]any{"name": fmt.Sprintf("invalid-%d", n), "labels": map[string]any{revisionLabel: "default"}},
		"spec": map[string]any{"servers": []any{map[string]any{
			"port":  map[string]any{"number": int64(80), "name": "http", "protocol": "HTTP"},
			"hosts": []any{"not a host!"}}}},
	}}
	_, err := w.dyn.Resource(gatewayGVR).Namespace(w.injectNS).Create(ctx, gw, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return fmt.Errorf("an invalid Gateway was admitted")
	case apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) || apierrors.IsInvalid(err):
		if strings.Contains(err.Error(), `admission webhook "rev.validation.istio.io" denied the request`) {
			return nil
		}
	}
	return fmt.Errorf("an invalid Gateway was refused, not by istiod's validation: %w", err)
}

// results are the admissions so far.
func (w *webhooks) results() (injections, validations []admitted, bundles, phases []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]admitted(nil), w.injections...), append([]admitted(nil), w.validations...), append([]string(nil), w.bundles...),
		append([]string(nil), w.phases...)
}

// writers are the field managers that wrote the configurations after this
// test's client created them (caBundle, failurePolicy).
func (w *webhooks) writers(ctx context.Context) []string {
	var fields []metav1.ManagedFieldsEntry
	admission := cluster.Client.AdmissionregistrationV1()
	if mwc, err := admission.MutatingWebhookConfigurations().Get(ctx, w.mutating, metav1.GetOptions{}); err == nil {
		fields = append(fields, mwc.ManagedFields...)
	}
	if vwc, err := admission.ValidatingWebhookConfigurations().Get(ctx, w.validate, metav1.GetOptions{}); err == nil {
		fields = append(fields, vwc.ManagedFields...)
	}
	var out []string
	for _, f := range fields {
		own := strings.HasPrefix(f.Manager, filepath.Base(os.Args[0]))
		if f.Operation == metav1.ManagedFieldsOperationUpdate && !own && !slices.Contains(out, f.Manager) {
			out = append(out, f.Manager)
		}
	}
	return out
}
