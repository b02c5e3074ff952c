package e2e

import (
	"bufio"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// podCertEnv is one test's signer name, trust domain, namespace, node and
// the node's own client, through which requests are created as a kubelet
// creates them (the Node authorizer and NodeRestriction apply).
type podCertEnv struct {
	signer, td, ns string
	node           *corev1.Node
	asNode         kubernetes.Interface
}

func newPodCertEnv(t *testing.T, name string) *podCertEnv {
	t.Helper()
	ctx := context.Background()
	n := time.Now().UnixNano() % 1e9
	e := &podCertEnv{signer: fmt.Sprintf("meshca.io/%s-%d", name, n), td: fmt.Sprintf("%s-%d.test", name, n),
		ns: cluster.Namespace(t, "pcr-"+name)}
	node, err := cluster.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%s-%d", name, n)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.node = node
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{})
		_ = cluster.Client.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), e.ctbName(), metav1.DeleteOptions{})
	})
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + node.Name, Groups: []string{"system:nodes", "system:authenticated"}}
	if e.asNode, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *podCertEnv) ctbName() string { return strings.ReplaceAll(e.signer, "/", ":") + ":" + e.td }

// start runs meshca as the signer of e, with its audit log in a file.
func (e *podCertEnv) start(t *testing.T, state, audit string, extra ...string) *server {
	t.Helper()
	args := append([]string{"--trust-domain", e.td, "--pod-certificate-signer-name", e.signer,
		"--trust-lease-namespace", e.ns, "--audit-log-file", audit}, extra...)
	if state == "" {
		return startServer(t, args...)
	}
	m := harness.StartMeshca(t, bin, append([]string{"--state-dir", state, "--kubeconfig", cluster.Kubeconfig}, args...)...)
	return &server{Meshca: m, stateDir: state}
}

// pod creates a Pod of sa on e's node that mounts a podCertificate volume
// of signer.
func (e *podCertEnv) pod(t testing.TB, name string, sa *corev1.ServiceAccount, signer string) *corev1.Pod {
	t.Helper()
	p, err := cluster.Client.CoreV1().Pods(e.ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa.Name, NodeName: e.node.Name, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app:1",
				VolumeMounts: []corev1.VolumeMount{{Name: "svid", MountPath: "/var/run/svid"}}}},
			Volumes: []corev1.Volume{{Name: "svid", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{
					SignerName: signer, KeyType: "ECDSAP256", CredentialBundlePath: "credentialbundle.pem"}}}}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// request creates, as the node, a PodCertificateRequest of pod for signer
// with key's public key.
func (e *podCertEnv) request(t testing.TB, pod *corev1.Pod, sa *corev1.ServiceAccount, signer string, key crypto.Signer, maxSeconds *int32) *certv1.PodCertificateRequest {
	t.Helper()
	stub, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.asNode.CertificatesV1().PodCertificateRequests(e.ns).Create(context.Background(), &certv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + "-"},
		Spec: certv1.PodCertificateRequestSpec{SignerName: signer, PodName: pod.Name, PodUID: pod.UID,
			ServiceAccountName: sa.Name, ServiceAccountUID: sa.UID, NodeName: types.NodeName(e.node.Name), NodeUID: e.node.UID,
			MaxExpirationSeconds: maxSeconds, StubPKCS10Request: stub},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PodCertificateRequest as node %s: %v", e.node.Name, err)
	}
	return r
}

// answered waits for r's terminal condition.
func answered(t testing.TB, r *certv1.PodCertificateRequest, timeout time.Duration) (*certv1.PodCertificateRequest, *metav1.Condition) {
	t.Helper()
	var got *certv1.PodCertificateRequest
	var cond *metav1.Condition
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = cluster.Client.CertificatesV1().PodCertificateRequests(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		cond = terminal(got)
		return cond != nil, nil
	})
	if err != nil {
		t.Fatalf("PodCertificateRequest %s/%s not answered: %v (status %+v)", r.Namespace, r.Name, err, got.Status)
	}
	return got, cond
}

func terminal(r *certv1.PodCertificateRequest) *metav1.Condition {
	for i, c := range r.Status.Conditions {
		switch c.Type {
		case certv1.PodCertificateRequestConditionTypeIssued, certv1.PodCertificateRequestConditionTypeDenied, certv1.PodCertificateRequestConditionTypeFailed:
			return &r.Status.Conditions[i]
		}
	}
	return nil
}

func newP256(t testing.TB) crypto.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// auditEvents reads the pod certificate events of an audit log file.
func auditEvents(t testing.TB, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err == nil && e["event"] == "pod_certificate" {
			out = append(out, e)
		}
	}
	return out
}

func podCertAuditPath(t testing.TB, name string) string {
	return filepath.Join(t.TempDir(), name+".jsonl")
}
