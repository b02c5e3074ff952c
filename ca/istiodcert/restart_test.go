package istiodcert

import (
	"context"
	"crypto/x509"
	"strings"
	"testing"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
