package chart

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	appsv1 "k8s.io/api/apps/v1"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestChartPodCertificates installs the chart with podCertificates on and
// runs meshca with the Deployment's arguments under its ServiceAccount's
// token: the authorizer allows what the PodCertificateRequest signer does
// and nothing wider (another signer name, the request's spec, Secrets),
// and a request a kubelet makes for a Pod is Issued with the Pod's SVID,
// which verifies against the ClusterTrustBundle of the signer name, the
// one ClusterTrustBundle meshca may update (it repairs an edit). Its own
// release name, so its cluster-wide RBAC does not replace the default
// install's.
func TestChartPodCertificates(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "chart-pcr")
	const release, sa = "pcr", "pcr-meshca"
	signer := fmt.Sprintf("meshca.io/chart-%d", time.Now().UnixNano()%1e9)
	out, err := harness.HelmTemplate(helm, release, ns, "--set", "podCertificates.signerName="+signer)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := harness.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	apply(t, objs, false)
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	ctb, err := trust.ClusterTrustBundleName(signer, td)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("rbac", func(t *testing.T) {
		const certs = "certificates.k8s.io"
		tests := []struct {
			a       harness.Access
			allowed bool
		}{
			{harness.Access{Verb: "list", Group: certs, Resource: "podcertificaterequests"}, true},
			{harness.Access{Verb: "watch", Group: certs, Resource: "podcertificaterequests"}, true},
			{harness.Access{Verb: "update", Group: certs, Resource: "podcertificaterequests/status", Namespace: "any-app"}, true},
			{harness.Access{Verb: "sign", Group: certs, Resource: "signers", Name: signer}, true},
			{harness.Access{Verb: "attest", Group: certs, Resource: "signers", Name: signer}, true},
			{harness.Access{Verb: "create", Group: certs, Resource: "clustertrustbundles"}, true},
			{harness.Access{Verb: "list", Group: certs, Resource: "clustertrustbundles", Name: ctb}, true},
			{harness.Access{Verb: "watch", Group: certs, Resource: "clustertrustbundles", Name: ctb}, true},
			{harness.Access{Verb: "update", Group: certs, Resource: "clustertrustbundles", Name: ctb}, true},
			{harness.Access{Verb: "get", Resource: "nodes", Name: "any-node"}, true},
			{harness.Access{Verb: "get", Resource: "serviceaccounts", Namespace: "any-app", Name: "web"}, true},
			{harness.Access{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: ns, Name: "meshca-pod-certificate-signer"}, true},

			{harness.Access{Verb: "sign", Group: certs, Resource: "signers", Name: "meshca.io/other"}, false},
			{harness.Access{Verb: "sign", Group: certs, Resource: "signers", Name: "kubernetes.io/kube-apiserver-client"}, false},
			{harness.Access{Verb: "update", Group: certs, Resource: "podcertificaterequests", Namespace: "any-app"}, false},
			{harness.Access{Verb: "create", Group: certs, Resource: "podcertificaterequests", Namespace: "any-app"}, false},
			{harness.Access{Verb: "delete", Group: certs, Resource: "podcertificaterequests", Namespace: "any-app"}, false},
			{harness.Access{Verb: "update", Group: certs, Resource: "certificatesigningrequests/approval"}, false},
			{harness.Access{Verb: "list", Resource: "nodes"}, false},
			{harness.Access{Verb: "get", Resource: "secrets", Namespace: "any-app", Name: "x"}, false},
			// Any ClusterTrustBundle is readable by every ServiceAccount
			// (Kubernetes' system:cluster-trust-bundle-discovery); only
			// meshca's own is writable by meshca.
			{harness.Access{Verb: "update", Group: certs, Resource: "clustertrustbundles", Name: "kubernetes.io:kube-apiserver-serving:x"}, false},
			{harness.Access{Verb: "update", Group: certs, Resource: "clustertrustbundles", Name: "meshca-cluster.local"}, false},
			{harness.Access{Verb: "delete", Group: certs, Resource: "clustertrustbundles", Name: ctb}, false},
		}
		for _, tt := range tests {
			got, err := cluster.Allowed(ctx, ns, sa, tt.a)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.allowed {
				t.Errorf("%s: %s allowed %v, want %v", sa, tt.a, got, tt.allowed)
			}
		}
	})

	var d appsv1.Deployment
	convert(t, find(t, objs, "Deployment", sa), &d)
	args := d.Spec.Template.Spec.Containers[0].Args
	if !strings.Contains(strings.Join(args, " "), "--pod-certificate-signer-name="+signer) {
		t.Fatalf("Deployment args %q do not name the signer", args)
	}
	m := harness.StartMeshca(t, bin, append(containerArgs(t, d.Spec.Template.Spec.Containers[0], ns), "--kubeconfig", cluster.ServiceAccountKubeconfig(t, ns, sa))...)

	apps := cluster.Namespace(t, "chart-pcr-apps")
	node := cluster.KubeletNode(t, "chart-pcr-node")
	web := cluster.ServiceAccount(t, apps, "web")
	pod := node.Pod(t, apps, "web-1", web, signer)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	r := node.Request(t, pod, web, signer, key, nil)
	got, cond := cluster.AnsweredPodCertificate(t, r, 30*time.Second)
	if cond.Type != certv1.PodCertificateRequestConditionTypeIssued {
		t.Fatalf("condition %s/%s %q, want Issued\n%s", cond.Type, cond.Reason, cond.Message, m.Logs())
	}
	chain, err := pemutil.ParseCertificates([]byte(got.Status.CertificateChain))
	if err != nil {
		t.Fatal(err)
	}
	var roots []byte
	waitFor(t, "the ClusterTrustBundle of "+signer, func() bool {
		l, err := cluster.Client.CertificatesV1().ClusterTrustBundles().List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=" + signer})
		if err != nil || len(l.Items) != 1 {
			return false
		}
		if l.Items[0].Name != ctb {
			t.Fatalf("ClusterTrustBundle %s, want %s (the name the ClusterRole grants)", l.Items[0].Name, ctb)
		}
		roots = []byte(l.Items[0].Spec.TrustBundle)
		return true
	})
	t.Run("ClusterTrustBundle repaired", func(t *testing.T) { checkClusterTrustBundleRepair(t, ctb, td.Name()) })
	anchors, err := pemutil.ParseCertificates(roots)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(td, anchors))
	if err != nil {
		t.Fatalf("the leaf does not verify against the ClusterTrustBundle: %v", err)
	}
	if want := spiffeid.RequireFromSegments(td, "ns", apps, "sa", "web"); id != want {
		t.Errorf("identity %s, want %s", id, want)
	}
	if logs := m.Logs(); strings.Contains(logs, "forbidden") || strings.Contains(logs, "not allowed") {
		t.Errorf("meshca was refused a request:\n%s", logs)
	}
}
