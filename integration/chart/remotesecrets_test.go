package chart

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestChartRemoteSecrets installs the chart for real with remote-cluster
// Secrets on, in the namespace of their own it creates: the apiserver's
// authorizer lets meshca list and watch the Secrets there and nothing
// more, and read no Secret of its own namespace (its CA state by name
// aside) or of istio-system; meshca, run with the Deployment's arguments
// under its ServiceAccount's token, adds the cluster of a labelled Secret
// put there and issues for a workload that cluster's apiserver vouches
// for.
func TestChartRemoteSecrets(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "meshca-remote")
	remoteNS := cluster.Namespace(t, "remote-secrets")
	objs := render(t, ns, "--set", "multiCluster.remoteSecrets.enabled=true", "--set", "multiCluster.remoteSecrets.namespace="+remoteNS)
	if n := find(t, objs, "Namespace", remoteNS); n.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Errorf("Namespace %s: want it kept on uninstall", remoteNS)
	}
	apply(t, objs, false)

	t.Run("rbac", func(t *testing.T) { checkRemoteSecretsAccess(t, ns, remoteNS) })

	// The remote cluster is this apiserver under another id, reached with
	// a token and inline CA as istioctl create-remote-secret writes them.
	kubeconfig, err := os.ReadFile(cluster.ServiceAccountKubeconfig(t, ns, "meshca"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: "istio-remote-secret-east", Labels: map[string]string{"istio/multiCluster": "true"}},
			Data: map[string][]byte{"east": kubeconfig}},
		// Not labelled: the informer never sees it.
		{ObjectMeta: metav1.ObjectMeta{Name: "unlabelled"}, Data: map[string][]byte{"north": kubeconfig}},
	} {
		if _, err := cluster.Client.CoreV1().Secrets(remoteNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	args := containerArgs(t, deployment(t, objs).Spec.Template.Spec.Containers[0], ns)
	if !slices.Contains(args, "--remote-secret-namespace="+remoteNS) {
		t.Fatalf("args %q: want --remote-secret-namespace=%s", args, remoteNS)
	}
	m := harness.StartMeshca(t, bin, append(args, "--kubeconfig", cluster.ServiceAccountKubeconfig(t, ns, "meshca"))...)
	if !m.WaitForLog(20*time.Second, `"msg":"remote cluster added"`, `"cluster":"east"`) {
		t.Fatalf("the cluster of the labelled Secret was not added:\n%s", m.Logs())
	}

	out, err := exec.Command(bin, "root", "bundle", "--state-secret", ns+"/meshca-ca-state", "--kubeconfig", cluster.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("meshca root bundle: %v", err)
	}
	roots, err := pemutil.ParseCertificates(out)
	if err != nil {
		t.Fatal(err)
	}
	apps := cluster.Namespace(t, "remote-apps")
	w := cluster.NewWorkload(t, apps, "cart", "node-a")
	fetch := func(clusterID string) error {
		c, err := checked.NewClient(t, caclient.Config{Addr: m.Addr, ServerName: "meshca." + ns + ".svc", Roots: certs.Pool(roots...),
			ClusterID: clusterID, TokenFile: harness.WriteToken(t, w.Token)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		id := spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", apps, "sa", "cart")
		_, err = c.Fetch(ctx, id, caclient.Options{})
		return err
	}
	if err := fetch("east"); err != nil {
		t.Errorf("clusterid east, from the remote Secret: %v\n%s", err, m.Logs())
	}
	if err := fetch("north"); err == nil {
		t.Error("clusterid north, from an unlabelled Secret: issued")
	}
	if logs := m.Logs(); strings.Contains(logs, "forbidden") || strings.Contains(logs, "not allowed") {
		t.Errorf("meshca was refused a request:\n%s", logs)
	}
}

// checkRemoteSecretsAccess asks the authorizer about Secrets as meshca's
// ServiceAccount with remote-cluster Secrets on.
func checkRemoteSecretsAccess(t *testing.T, ns, remoteNS string) {
	secrets := func(verb, namespace, name string) harness.Access {
		return harness.Access{Verb: verb, Resource: "secrets", Namespace: namespace, Name: name}
	}
	tests := []struct {
		a       harness.Access
		allowed bool
	}{
		// What the informer does, there alone.
		{secrets("list", remoteNS, ""), true},
		{secrets("watch", remoteNS, ""), true},
		{secrets("get", ns, "meshca-ca-state"), true},

		{secrets("get", remoteNS, "istio-remote-secret-east"), false},
		{secrets("create", remoteNS, ""), false},
		{secrets("update", remoteNS, "istio-remote-secret-east"), false},
		{secrets("delete", remoteNS, "istio-remote-secret-east"), false},
		{secrets("deletecollection", remoteNS, ""), false},
		{secrets("list", ns, ""), false},
		{secrets("watch", ns, ""), false},
		{secrets("get", ns, "cacerts"), false},
		{secrets("get", ns, "istio-ca-secret"), false},
		{secrets("list", "istio-system", ""), false},
		{secrets("watch", "istio-system", ""), false},
		{secrets("get", "istio-system", "cacerts"), false},
		{secrets("get", "istio-system", "istio-ca-secret"), false},
		{secrets("get", "istio-system", "istiod-tls"), false},
		{secrets("list", "", ""), false},
		{secrets("watch", "", ""), false},
		{harness.Access{Verb: "list", Resource: "configmaps", Namespace: remoteNS}, false},
		{harness.Access{Verb: "list", Resource: "serviceaccounts", Namespace: remoteNS}, false},
	}
	for _, tt := range tests {
		got, err := cluster.Allowed(context.Background(), ns, "meshca", tt.a)
		if err != nil {
			t.Fatal(err)
		}
		if got != tt.allowed {
			t.Errorf("meshca: %s allowed %v, want %v", tt.a, got, tt.allowed)
		}
	}
}
