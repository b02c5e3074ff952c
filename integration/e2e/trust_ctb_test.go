package e2e

import (
	"context"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	certv1 "k8s.io/api/certificates/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// meshcaSigner is the signer name the tests link the ClusterTrustBundle
// to, the one the chart's values grant attest on in these tests.
const meshcaSigner = "meshca.io/svid"

// ctbTrustDomain is a trust domain of one test: the ClusterTrustBundle is
// cluster-scoped and named after it, and the cluster is shared.
func ctbTrustDomain(t *testing.T, name string) string {
	t.Helper()
	td := fmt.Sprintf("%s-%d.test", name, time.Now().UnixNano()%1e9)
	t.Cleanup(func() {
		for _, n := range []string{"meshca-" + td, strings.ReplaceAll(meshcaSigner, "/", ":") + ":" + td} {
			_ = cluster.Client.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	return td
}

func clusterTrustBundle(t *testing.T, client kubernetes.Interface, name string) *certv1.ClusterTrustBundle {
	t.Helper()
	b, err := client.CertificatesV1().ClusterTrustBundles().Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// holdsRoots reports whether b is meshca's, for td, and carries exactly
// roots, each once.
func holdsRoots(b *certv1.ClusterTrustBundle, td string, roots []*x509.Certificate) bool {
	if b == nil || b.Labels[trust.LabelManagedBy] != trust.ManagedBy || b.Labels[trust.LabelTrustDomain] != td {
		return false
	}
	got, err := pemutil.ParseCertificates([]byte(b.Spec.TrustBundle))
	if err != nil || len(got) != len(roots) {
		return false
	}
	for _, r := range roots {
		if !slices.ContainsFunc(got, r.Equal) {
			return false
		}
	}
	return true
}

// waitCTB waits until the ClusterTrustBundle name holds the roots in the
// CA state of stateDir, and returns how long that took.
func waitCTB(t *testing.T, what, name, td, stateDir string, within time.Duration) time.Duration {
	t.Helper()
	roots, _, err := harness.RootBundle(context.Background(), bin, "--state-dir", stateDir)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for !holdsRoots(clusterTrustBundle(t, cluster.Client, name), td, roots) {
		if time.Since(start) > within {
			t.Fatalf("%s: ClusterTrustBundle %s does not hold the %d roots of the CA state within %v: %+v",
				what, name, len(roots), within, clusterTrustBundle(t, cluster.Client, name))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// TestClusterTrustBundleTracksRotation: `meshca serve
// --publish-cluster-trust-bundle --cluster-trust-bundle-signer-name`
// creates meshca.io:svid:<trust domain>, linked to the signer and
// labelled for a projected volume's selector; every `meshca root` step
// reaches it within 5 s, and an edit or a deletion is repaired within 5 s.
func TestClusterTrustBundleTracksRotation(t *testing.T) {
	td := ctbTrustDomain(t, "ctb-rotation")
	name := "meshca.io:svid:" + td
	s := startServer(t, "--trust-domain", td, "--publish-cluster-trust-bundle", "--cluster-trust-bundle-signer-name", meshcaSigner,
		"--trust-lease-namespace", cluster.Namespace(t, "ctb-lease"), "--auto-rotate=false")
	waitCTB(t, "first write", name, td, s.stateDir, 20*time.Second) // leader election, then the first write
	if !s.WaitForLog(time.Second, `"msg":"publishing the trust bundle as a ClusterTrustBundle"`, `"version":"certificates.k8s.io/v1"`, `"name":"`+name+`"`) {
		t.Errorf("no log line saying where the bundle is published:\n%s", s.Logs())
	}
	if got := clusterTrustBundle(t, cluster.Client, name).Spec.SignerName; got != meshcaSigner {
		t.Errorf("spec.signerName = %q, want %q", got, meshcaSigner)
	}
	// What a clusterTrustBundle projected volume selects.
	list, err := cluster.Client.CertificatesV1().ClusterTrustBundles().List(context.Background(), metav1.ListOptions{
		FieldSelector: "spec.signerName=" + meshcaSigner, LabelSelector: trust.LabelTrustDomain + "=" + td})
	if err != nil || len(list.Items) != 1 || list.Items[0].Name != name {
		t.Fatalf("by signer name and trust domain label: %v, %v; want %s alone", list, err, name)
	}

	st := "--state-dir=" + s.stateDir
	for _, step := range [][]string{
		{"prepare", st},
		{"activate", st, "--force", "--reason", "e2e ClusterTrustBundle"},
		{"retire", st, "--force", "--reason", "e2e ClusterTrustBundle"},
	} {
		if out, code := rootStep(t, step...); code != 0 {
			t.Fatalf("%s: exit %d\n%s", step[0], code, out)
		}
		took := waitCTB(t, step[0], name, td, s.stateDir, 5*time.Second)
		t.Logf("%s reached the ClusterTrustBundle after %v", step[0], took.Round(time.Millisecond))
	}
	if b := clusterTrustBundle(t, cluster.Client, name); strings.Count(b.Spec.TrustBundle, "BEGIN CERTIFICATE") != 1 {
		t.Fatalf("after retire the bundle holds:\n%s", b.Spec.TrustBundle)
	}

	ctx := context.Background()
	ctbs := cluster.Client.CertificatesV1().ClusterTrustBundles()
	other, err := keymgr.NewRoot(keymgr.RootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := clusterTrustBundle(t, cluster.Client, name)
	b.Spec.TrustBundle = string(pemutil.EncodeCertificates(other.Roots...))
	if _, err := ctbs.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("an edited bundle repaired after %v", waitCTB(t, "edited bundle", name, td, s.stateDir, 5*time.Second).Round(time.Millisecond))

	b = clusterTrustBundle(t, cluster.Client, name)
	b.Labels[trust.LabelTrustDomain] = "elsewhere"
	b.Labels["team"] = "platform"
	if _, err := ctbs.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCTB(t, "edited label", name, td, s.stateDir, 5*time.Second)
	if got := clusterTrustBundle(t, cluster.Client, name).Labels["team"]; got != "platform" {
		t.Errorf("a label meshca does not own was dropped: team=%q", got)
	}

	if err := ctbs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("a deleted bundle recreated after %v", waitCTB(t, "deleted", name, td, s.stateDir, 5*time.Second).Round(time.Millisecond))
}

// TestClusterTrustBundleUnlinkedLeavesForeignObject: without a signer
// name the bundle is meshca-<trust domain>, linked to none. An object of
// that name meshca did not create is left alone (one log line), while
// the ConfigMap publisher beside it writes; once that object is deleted,
// meshca publishes its own.
func TestClusterTrustBundleUnlinkedLeavesForeignObject(t *testing.T) {
	td := ctbTrustDomain(t, "ctb-unlinked")
	name := "meshca-" + td
	foreignRoot, err := keymgr.NewRoot(keymgr.RootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ctbs := cluster.Client.CertificatesV1().ClusterTrustBundles()
	foreign, err := ctbs.Create(ctx, &certv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certv1.ClusterTrustBundleSpec{TrustBundle: string(pemutil.EncodeCertificates(foreignRoot.Roots...))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lbls, sel := runLabel(t)
	apps := trustNamespace(t, "ctb-apps", lbls)
	s := startServer(t, "--trust-domain", td, "--publish-cluster-trust-bundle", "--publish-root-cert-configmaps",
		"--trust-namespace-selector", sel.String(), "--trust-lease-namespace", cluster.Namespace(t, "ctb-lease"))
	waitPublished(t, "ConfigMap beside the ClusterTrustBundle", string(s.rootsPEM), apps)
	if !s.WaitForLog(5*time.Second, `"msg":"a ClusterTrustBundle of that name exists and is not managed by meshca; leaving it alone"`, `"name":"`+name+`"`) {
		t.Fatalf("no warning about the foreign ClusterTrustBundle:\n%s", s.Logs())
	}
	if got := clusterTrustBundle(t, cluster.Client, name); got.ResourceVersion != foreign.ResourceVersion {
		t.Fatalf("the foreign ClusterTrustBundle was written: %+v", got)
	}

	if err := ctbs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCTB(t, "after the foreign object went", name, td, s.stateDir, 5*time.Second)
	if got := clusterTrustBundle(t, cluster.Client, name).Spec.SignerName; got != "" {
		t.Errorf("spec.signerName = %q, want none", got)
	}
}

// TestClusterTrustBundleOtherAPIVersions runs meshca against apiservers
// of its own whose --runtime-config serves only v1beta1 of the API, or
// none of it: meshca publishes through v1beta1, or logs once that it
// skips the ClusterTrustBundle and serves on, publishing the ConfigMaps.
func TestClusterTrustBundleOtherAPIVersions(t *testing.T) {
	for _, tc := range []struct {
		name, runtimeConfig, want string
	}{
		{"v1beta1 only", "certificates.k8s.io/v1/clustertrustbundles=false,certificates.k8s.io/v1beta1/clustertrustbundles=true",
			`"msg":"publishing the trust bundle as a ClusterTrustBundle","name":"meshca.io:svid:cluster.local","signer_name":"meshca.io/svid","version":"certificates.k8s.io/v1beta1"`},
		{"none", "certificates.k8s.io/v1/clustertrustbundles=false",
			`"msg":"the apiserver serves no ClusterTrustBundle API (certificates.k8s.io/v1, certificates.k8s.io/v1beta1, certificates.k8s.io/v1alpha1); not publishing the trust bundle as a ClusterTrustBundle","name":"meshca.io:svid:cluster.local","signer_name":"meshca.io/svid"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KAS_EXTRA_ARGS", "--runtime-config="+tc.runtimeConfig)
			c, err := harness.StartCluster(context.Background(), filepath.Join(t.TempDir(), "k8s"))
			if err != nil {
				t.Fatalf("apiserver with --runtime-config=%s: %v", tc.runtimeConfig, err)
			}
			t.Cleanup(c.Stop)
			apps := c.Namespace(t, "ctb-apps")
			s := startServerAs(t, c.Kubeconfig, "--publish-cluster-trust-bundle", "--cluster-trust-bundle-signer-name", meshcaSigner,
				"--publish-root-cert-configmaps", "--trust-lease-namespace", c.Namespace(t, "ctb-lease"))
			if !s.WaitForLog(20*time.Second, tc.want) {
				t.Fatalf("no line %s:\n%s", tc.want, s.Logs())
			}
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				cm, err := c.Client.CoreV1().ConfigMaps(apps).Get(context.Background(), trust.ConfigMapName, metav1.GetOptions{})
				if err == nil && cm.Data[trust.DataKey] == string(s.rootsPEM) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the ConfigMap publisher beside it did not write within 5s: %v", err)
				}
			}
			if tc.name != "v1beta1 only" {
				time.Sleep(time.Second)
				if st := s.Exited(); st != nil {
					t.Fatalf("meshca exited: %v\n%s", st, s.Logs())
				}
				return
			}
			var got *certv1beta1.ClusterTrustBundle
			for deadline := time.Now().Add(5 * time.Second); got == nil || got.Spec.TrustBundle != string(s.rootsPEM); time.Sleep(50 * time.Millisecond) {
				got, _ = c.Client.CertificatesV1beta1().ClusterTrustBundles().Get(context.Background(), "meshca.io:svid:cluster.local", metav1.GetOptions{})
				if time.Now().After(deadline) {
					t.Fatalf("not published through v1beta1 within 5s: %+v", got)
				}
			}
			if got.Spec.SignerName != meshcaSigner || got.Labels[trust.LabelManagedBy] != trust.ManagedBy {
				t.Errorf("v1beta1 object: %+v", got)
			}
		})
	}
}

// TestClusterTrustBundleManifestsRBAC: meshca running as the
// ServiceAccount of the Helm chart, installed with its ConfigMaps (off by
// default since istiod writes them) and its ClusterTrustBundle for
// meshca.io/svid on, publishes the ConfigMaps and the
// ClusterTrustBundle of its signer, elected on its Lease in istio-system;
// the attest grant is for that signer alone.
func TestClusterTrustBundleManifestsRBAC(t *testing.T) {
	applyChart(t, "--set", "trust.rootCertConfigMaps.enabled=true",
		"--set", "trust.clusterTrustBundle.enabled=true", "--set", "trust.clusterTrustBundle.signerName="+meshcaSigner)
	kubeconfig := cluster.ServiceAccountKubeconfig(t, "istio-system", "meshca")
	td := ctbTrustDomain(t, "ctb-rbac")
	lbls, sel := runLabel(t)
	apps := trustNamespace(t, "ctb-rbac-apps", lbls)
	args := []string{"--trust-domain", td, "--publish-cluster-trust-bundle", "--publish-root-cert-configmaps",
		"--trust-namespace-selector", sel.String(), "--trust-lease-namespace", "istio-system"}

	s := startServerAs(t, kubeconfig, append(args, "--cluster-trust-bundle-signer-name", meshcaSigner)...)
	waitPublished(t, "ConfigMap as the ServiceAccount", string(s.rootsPEM), apps)
	waitCTB(t, "ClusterTrustBundle as the ServiceAccount", "meshca.io:svid:"+td, td, s.stateDir, 5*time.Second)
	if strings.Contains(s.Logs(), "not allowed") {
		t.Errorf("refused writes:\n%s", s.Logs())
	}
	s.Stop() // releases the Lease for the next one
	// The next server's CA state is another one (another lineage), which
	// the Lease's record keeps from publishing unless an operator removes
	// it (TestNewLineageKeepsPublishedBundle).
	unrecord(t, "istio-system", trust.AnnotationLineage, trust.AnnotationSequence)

	s = startServerAs(t, kubeconfig, append(args, "--cluster-trust-bundle-signer-name", "other.example/svid")...)
	want := `"msg":"not allowed to create the trust bundle ClusterTrustBundle; it needs list, watch, create and update on clustertrustbundles, and attest on the certificates.k8s.io signer other.example/svid"`
	if !s.WaitForLog(20*time.Second, want) {
		t.Fatalf("no refusal for a signer the role does not grant:\n%s", s.Logs())
	}
	if clusterTrustBundle(t, cluster.Client, "other.example:svid:"+td) != nil {
		t.Error("a ClusterTrustBundle of a signer meshca may not attest for exists")
	}
}
