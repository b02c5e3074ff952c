package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// TestMultiCluster: a second, real apiserver is a remote cluster. The
// clusterid header picks the apiserver that reviews the token, whether the
// remote comes from a flag or from a labelled Secret added at run time.
func TestMultiCluster(t *testing.T) {
	remote, err := harness.StartCluster(context.Background(), filepath.Join(t.TempDir(), "east"))
	if err != nil {
		t.Fatalf("second apiserver: %v", err)
	}
	t.Cleanup(remote.Stop)
	ns := remote.Namespace(t, "east-apps")
	w := remote.NewWorkload(t, ns, "checkout", "east-node-1")
	id := spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", ns, "sa", "checkout")
	secretNS := cluster.Namespace(t, "meshca")
	s := startServer(t, "--remote-cluster", "east="+remote.Kubeconfig, "--remote-secret-namespace", secretNS)

	fetch := func(clusterID string) error {
		c, err := checked.NewClient(t, caclient.Config{Addr: s.Addr, ServerName: "istiod.istio-system.svc", Roots: s.roots,
			TokenFile: harness.WriteToken(t, w.Token), ClusterID: clusterID})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Fetch(context.Background(), id, caclient.Options{})
		return err
	}
	if err := fetch("east"); err != nil {
		t.Fatalf("clusterid east: %v", err)
	}
	if err := fetch("Kubernetes"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("east's token reviewed by the local apiserver: %v, want Unauthenticated", err)
	}
	if err := fetch("west"); status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), `unknown cluster "west"`) {
		t.Fatalf("unknown cluster: %v", err)
	}

	kubeconfig, err := os.ReadFile(remote.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "remote-west", Labels: map[string]string{"istio/multiCluster": "true"}},
		Data:       map[string][]byte{"west": kubeconfig},
	}
	if _, err := cluster.Client.CoreV1().Secrets(secretNS).Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCode(t, func() error { return fetch("west") }, codes.OK)

	// A Secret whose kubeconfig would run a command is refused: the
	// cluster is never added, and the log says why.
	evil := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "remote-north", Labels: map[string]string{"istio/multiCluster": "true"}},
		Data: map[string][]byte{"north": []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: ["-c", "cat /etc/shadow"]}}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)},
	}
	if _, err := cluster.Client.CoreV1().Secrets(secretNS).Create(context.Background(), evil, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !s.WaitForLog(10*time.Second, `"msg":"remote cluster refused"`, `"cluster":"north"`) {
		t.Error("refusal of an exec kubeconfig not logged")
	}
	if err := fetch("north"); status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), `unknown cluster "north"`) {
		t.Fatalf("cluster from an exec kubeconfig: %v, want it never added", err)
	}

	// The working kubeconfig of west, but believing whoever answers at
	// its address: refused, as that answer would decide which identities
	// meshca issues.
	blind, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range blind.Clusters {
		c.CertificateAuthorityData, c.InsecureSkipTLSVerify = nil, true
	}
	blindRaw, err := clientcmd.Write(*blind)
	if err != nil {
		t.Fatal(err)
	}
	south := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "remote-south", Labels: map[string]string{"istio/multiCluster": "true"}},
		Data:       map[string][]byte{"south": blindRaw},
	}
	if _, err := cluster.Client.CoreV1().Secrets(secretNS).Create(context.Background(), south, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !s.WaitForLog(10*time.Second, `"msg":"remote cluster refused"`, `"cluster":"south"`, `insecure-skip-tls-verify`) {
		t.Error("refusal of a kubeconfig that skips TLS verification not logged")
	}
	if err := fetch("south"); status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), `unknown cluster "south"`) {
		t.Fatalf("cluster from a kubeconfig that skips TLS verification: %v, want it never added", err)
	}

	if err := cluster.Client.CoreV1().Secrets(secretNS).Delete(context.Background(), "remote-west", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCode(t, func() error { return fetch("west") }, codes.Unauthenticated)
	if !s.WaitForLog(5*time.Second, `"msg":"remote cluster removed"`, `"cluster":"west"`) {
		t.Error("removal not logged")
	}
}
