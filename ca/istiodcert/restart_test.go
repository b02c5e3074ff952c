package istiodcert

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// TestKeeperRestartsIstiod: when the roots grow, istiod's Deployment is
// restarted once what its new Pods read holds them (the Secret, then
// istio-ca-root-cert in its namespace); not when a root leaves; and Read
// tells the guards which roots the Pods started with and whether a
// rollout is under way.
func TestKeeperRestartsIstiod(t *testing.T) {
	k, tc, client, rootA := newTest(t)
	k.c.Deployment = "istiod"
	ctx := context.Background()
	one := int32(1)
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istiod", Generation: 1},
		Spec:   appsv1.DeploymentSpec{Replicas: &one},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 1, Replicas: 1, UpdatedReplicas: 1, AvailableReplicas: 1}}
	if _, err := client.AppsV1().Deployments("istio-system").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	publish := func(roots ...*x509.Certificate) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: trust.ConfigMapName},
			Data: map[string]string{trust.DataKey: string(pemutil.EncodeCertificates(roots...))}}
		if _, err := client.CoreV1().ConfigMaps("istio-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			if _, err := client.CoreV1().ConfigMaps("istio-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	trusted := func() string {
		d, err := client.AppsV1().Deployments("istio-system").Get(ctx, "istiod", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return d.Spec.Template.Annotations[AnnotationTrustedRoots]
	}
	publish(rootA.Cert)
	look(t, k, client)
	if got := trusted(); got != keymgr.Fingerprint(rootA.Cert) {
		t.Fatalf("after the first write the template trusts %q, want root A", got)
	}

	rootB := testca.NewRoot(t, "root B", testca.Options{})
	tc.setRoots(rootA.Cert, rootB.Cert)
	look(t, k, client)
	if got := trusted(); strings.Contains(got, keymgr.Fingerprint(rootB.Cert)) {
		t.Fatal("restarted before istio-ca-root-cert, which istiod reads first, held the new root")
	}
	publish(rootA.Cert, rootB.Cert)
	look(t, k, client)
	if got := trusted(); got != strings.Join(fingerprints([]*x509.Certificate{rootA.Cert, rootB.Cert}), ",") {
		t.Fatalf("after prepare the template trusts %q, want A and B", got)
	}
	// The apiserver bumped the generation; the rollout has not ended.
	d, _ := client.AppsV1().Deployments("istio-system").Get(ctx, "istiod", metav1.GetOptions{})
	d.Generation = 2
	if _, err := client.AppsV1().Deployments("istio-system").Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := Read(ctx, client, "istio-system", "istiod-tls")
	if got.Restarter != "Deployment istio-system/istiod" || !got.Restarting || len(got.Loaded) != 2 || got.Err != nil {
		t.Fatalf("Read during the rollout: %+v", got)
	}
	d.Status.ObservedGeneration = 2
	if _, err := client.AppsV1().Deployments("istio-system").UpdateStatus(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := Read(ctx, client, "istio-system", "istiod-tls"); got.Restarting {
		t.Fatalf("Read after the rollout: %+v", got)
	}

	// retire: the roots shrink; istiod trusting a retired root a while
	// longer breaks nothing, so it is not restarted for it.
	tc.setRoots(rootB.Cert)
	publish(rootB.Cert)
	look(t, k, client)
	if got := trusted(); !strings.Contains(got, keymgr.Fingerprint(rootA.Cert)) {
		t.Fatalf("restarted when a root left: %q", got)
	}
}

// TestRestartPatch: the restart sets the trusted-roots pod template
// annotation and nothing else, the one change the chart's admission
// policy lets meshca's account make.
func TestRestartPatch(t *testing.T) {
	fps := []string{strings.Repeat("a", 64), strings.Repeat("b", 64)}
	want := `{"spec":{"template":{"metadata":{"annotations":{"meshca.io/trusted-roots":"` + fps[0] + "," + fps[1] + `"}}}}}`
	if got := string(RestartPatch(fps)); got != want {
		t.Fatalf("RestartPatch = %s\nwant %s", got, want)
	}
}

// TestProbeRestartGuard: when it starts, the keeper asks the apiserver,
// in a dry run, for a change the restart does not need, and logs whether
// an admission policy refused it.
func TestProbeRestartGuard(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		level slog.Level
		log   string
	}{
		{"guarded", apierrors.NewForbidden(appsv1.Resource("deployments"), "istiod",
			errors.New(`ValidatingAdmissionPolicy 'meshca.istio-system.istiod-restart.meshca.io' with binding 'x' denied request: meshca's account may change istiod's Deployment only to restart it`)),
			slog.LevelInfo, "istiod's Deployment is guarded"},
		{"not guarded", nil, slog.LevelWarn, "istiod's Deployment takes any change from this account"},
		{"not allowed to patch at all", apierrors.NewForbidden(appsv1.Resource("deployments"), "istiod", errors.New("RBAC")),
			slog.LevelDebug, "the restart guard could not be probed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, _, client, _ := newTest(t)
			k.c.Deployment = "istiod"
			var logs strings.Builder
			k.c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			var got k8stesting.PatchActionImpl
			client.PrependReactor("patch", "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
				got = a.(k8stesting.PatchActionImpl)
				return true, &appsv1.Deployment{}, tt.err
			})
			k.probeRestartGuard(context.Background())
			if !slices.Equal(got.PatchOptions.DryRun, []string{metav1.DryRunAll}) || !strings.Contains(string(got.Patch), probeAnnotation) {
				t.Fatalf("probe %s with options %+v, want a dry run adding %s", got.Patch, got.PatchOptions, probeAnnotation)
			}
			if !strings.Contains(logs.String(), "level="+tt.level.String()) || !strings.Contains(logs.String(), tt.log) {
				t.Errorf("log:\n%s\nwant a %s line saying %q", logs.String(), tt.level, tt.log)
			}
		})
	}
}
