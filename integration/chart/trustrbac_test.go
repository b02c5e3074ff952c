package chart

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// TestChartClusterTrustBundleName: the ClusterRole names the one
// ClusterTrustBundle meshca publishes, as trust.ClusterTrustBundleName
// computes it from the Deployment's arguments, for each way the chart
// turns the publisher on.
func TestChartClusterTrustBundleName(t *testing.T) {
	tests := []struct {
		name, values string
		td, signer   string // what meshca is started with
	}{
		{"unlinked", "trust: {clusterTrustBundle: {enabled: true}}", "cluster.local", ""},
		{"linked with an underscore in the trust domain", "ca: {trustDomain: east_mesh.example}\ntrust: {clusterTrustBundle: {enabled: true, signerName: meshca.io/svid}}",
			"east_mesh.example", "meshca.io/svid"},
		{"pod certificates", "podCertificates: {signerName: meshca.io/pods}", "cluster.local", "meshca.io/pods"},
		{"pod certificates and the publisher on", "podCertificates: {signerName: meshca.io/pods}\ntrust: {clusterTrustBundle: {enabled: true}}",
			"cluster.local", "meshca.io/pods"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(file, []byte(tt.values+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			objs := render(t, "istio-system", "--values", file)
			args := deployment(t, objs).Spec.Template.Spec.Containers[0].Args
			want := []string{"--trust-domain=" + tt.td}
			if slices.Contains(args, "--publish-cluster-trust-bundle") && tt.signer != "" {
				want = append(want, "--cluster-trust-bundle-signer-name="+tt.signer)
			}
			wantArgs(t, "serve", args, want, nil)
			name, err := trust.ClusterTrustBundleName(tt.signer, spiffeid.RequireTrustDomainFromString(tt.td))
			if err != nil {
				t.Fatal(err)
			}
			var got [][]string
			for _, r := range clusterRole(t, objs).Rules {
				if slices.Contains(r.Resources, "clustertrustbundles") {
					got = append(got, r.ResourceNames)
					if r.ResourceNames == nil && !slices.Equal(r.Verbs, []string{"create"}) {
						t.Errorf("rule %+v: only create may go unnamed", r)
					}
				}
			}
			if !slices.ContainsFunc(got, func(n []string) bool { return slices.Equal(n, []string{name}) }) {
				t.Errorf("clustertrustbundles rules name %q, want %q (what meshca writes)", got, name)
			}
		})
	}
}

// checkConfigMapAccess makes meshca's ConfigMap requests, and others, as
// meshca's ServiceAccount: the list of istio-ca-root-cert by field
// selector (what its informer sends) is allowed, another ConfigMap is
// neither read nor written nor listed; and meshca, running under that
// account, repairs an edit of the ConfigMap in apps, an update by name.
func checkConfigMapAccess(t *testing.T, kubeconfig, apps, root string) {
	ctx := context.Background()
	sa := harness.ClientOf(t, kubeconfig)
	coredns := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"}, Data: map[string]string{"Corefile": ".:53 {}"}}
	switch _, err := cluster.Client.CoreV1().ConfigMaps("kube-system").Create(ctx, coredns, metav1.CreateOptions{}); {
	case err == nil:
		t.Cleanup(func() {
			_ = cluster.Client.CoreV1().ConfigMaps("kube-system").Delete(context.Background(), "coredns", metav1.DeleteOptions{})
		})
	case !apierrors.IsAlreadyExists(err):
		t.Fatal(err)
	}
	byName := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", trust.ConfigMapName).String()}
	l, err := sa.CoreV1().ConfigMaps("").List(ctx, byName)
	if err != nil || !slices.ContainsFunc(l.Items, func(c corev1.ConfigMap) bool { return c.Namespace == apps }) {
		t.Errorf("list of %s by field selector as meshca: %v, want %s's among them", trust.ConfigMapName, err, apps)
	}
	denied := []struct {
		what string
		do   func() error
	}{
		{"get kube-system/coredns", func() error {
			_, err := sa.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
			return err
		}},
		{"update kube-system/coredns", func() error {
			_, err := sa.CoreV1().ConfigMaps("kube-system").Update(ctx, coredns, metav1.UpdateOptions{})
			return err
		}},
		{"list every ConfigMap", func() error {
			_, err := sa.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list kube-system's ConfigMaps", func() error {
			_, err := sa.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"watch every ConfigMap", func() error {
			w, err := sa.CoreV1().ConfigMaps("").Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		}},
	}
	for _, d := range denied {
		if err := d.do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s as meshca: %v, want forbidden", d.what, err)
		}
	}

	cm, err := cluster.Client.CoreV1().ConfigMaps(apps).Get(ctx, trust.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[trust.DataKey] = "edited"
	if _, err := cluster.Client.CoreV1().ConfigMaps(apps).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, fmt.Sprintf("meshca repairing %s/%s", apps, trust.ConfigMapName), func() bool {
		cm, err := cluster.Client.CoreV1().ConfigMaps(apps).Get(ctx, trust.ConfigMapName, metav1.GetOptions{})
		return err == nil && cm.Data[trust.DataKey] == root
	})
}

// checkClusterTrustBundleRepair edits meshca's trust domain label off the
// ClusterTrustBundle name: meshca, allowed to update that one object,
// puts it back.
func checkClusterTrustBundleRepair(t *testing.T, name, td string) {
	ctx := context.Background()
	ctbs := cluster.Client.CertificatesV1().ClusterTrustBundles()
	b, err := ctbs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Labels[trust.LabelTrustDomain] = "edited"
	if _, err := ctbs.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "meshca repairing ClusterTrustBundle "+name, func() bool {
		b, err := ctbs.Get(ctx, name, metav1.GetOptions{})
		return err == nil && b.Labels[trust.LabelTrustDomain] == td
	})
}

// checkCRLAccess: with --publish-crl (Istio mode) meshca's account lists
// and watches istio-ca-crl cluster-wide by its name, as the publisher's
// informer does, and creates and updates it.
func checkCRLAccess(t *testing.T, kubeconfig, ns string) {
	ctx := context.Background()
	sa := harness.ClientOf(t, kubeconfig)
	byName := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", trust.CRLConfigMapName).String()}
	if _, err := sa.CoreV1().ConfigMaps("").List(ctx, byName); err != nil {
		t.Errorf("list of %s by field selector as meshca: %v", trust.CRLConfigMapName, err)
	}
	w, err := sa.CoreV1().ConfigMaps("").Watch(ctx, byName)
	if err != nil {
		t.Errorf("watch of %s by field selector as meshca: %v", trust.CRLConfigMapName, err)
	} else {
		w.Stop()
	}
	// meshca itself may have published it already: the checks are dry
	// runs, which the apiserver authorizes as it would the writes, and
	// AlreadyExists comes only after authorization.
	dry := []string{metav1.DryRunAll}
	_, err = sa.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: trust.CRLConfigMapName, Namespace: ns},
		Data: map[string]string{trust.CRLDataKey: ""}}, metav1.CreateOptions{DryRun: dry})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create %s as meshca: %v", trust.CRLConfigMapName, err)
	}
	var cm *corev1.ConfigMap
	waitFor(t, "meshca publishing "+trust.CRLConfigMapName+" in "+ns, func() bool {
		cm, err = cluster.Client.CoreV1().ConfigMaps(ns).Get(ctx, trust.CRLConfigMapName, metav1.GetOptions{})
		return err == nil
	})
	if _, err := sa.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{DryRun: dry}); err != nil {
		t.Errorf("update %s as meshca: %v", trust.CRLConfigMapName, err)
	}
}
