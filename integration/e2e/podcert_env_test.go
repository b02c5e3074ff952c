package e2e

import (
	"bufio"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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
)

// podCertEnv is one test's signer name, trust domain, namespace and node,
// whose kubelet creates the requests (the Node authorizer and
// NodeRestriction apply).
type podCertEnv struct {
	signer, td, ns string
	node           *harness.KubeletNode
}

func newPodCertEnv(t *testing.T, name string) *podCertEnv {
	t.Helper()
	n := time.Now().UnixNano() % 1e9
	e := &podCertEnv{signer: fmt.Sprintf("meshca.io/%s-%d", name, n), td: fmt.Sprintf("%s-%d.test", name, n),
		ns: cluster.Namespace(t, "pcr-"+name)}
	e.node = cluster.KubeletNode(t, fmt.Sprintf("node-%s-%d", name, n))
	t.Cleanup(func() {
		_ = cluster.Client.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), e.ctbName(), metav1.DeleteOptions{})
	})
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
	return e.node.Pod(t, e.ns, name, sa, signer)
}

// request creates, as the node, a PodCertificateRequest of pod for signer
// with key's public key.
func (e *podCertEnv) request(t testing.TB, pod *corev1.Pod, sa *corev1.ServiceAccount, signer string, key crypto.Signer, maxSeconds *int32) *certv1.PodCertificateRequest {
	t.Helper()
	return e.node.Request(t, pod, sa, signer, key, maxSeconds)
}

// answered waits for r's terminal condition.
func answered(t testing.TB, r *certv1.PodCertificateRequest, timeout time.Duration) (*certv1.PodCertificateRequest, *metav1.Condition) {
	t.Helper()
	return cluster.AnsweredPodCertificate(t, r, timeout)
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
