package harness

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// KubeletNode is a Node and a client acting as its kubelet: the user
// system:node:<name> in system:nodes, so the Node authorizer and the
// NodeRestriction admission plugin judge what it creates, as they judge a
// real kubelet's PodCertificateRequests.
type KubeletNode struct {
	Node   *corev1.Node
	Client kubernetes.Interface
	c      *Cluster
}

// KubeletNode creates the Node name (deleted at the end of the test) and
// its kubelet's client.
func (c *Cluster) KubeletNode(tb testing.TB, name string) *KubeletNode {
	tb.Helper()
	node, err := c.Client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + name, Groups: []string{"system:nodes", "system:authenticated"}}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return &KubeletNode{Node: node, Client: cs, c: c}
}

// Pod creates, in ns on this node, a Pod of sa that mounts a podCertificate
// projected volume of signer (an ECDSA P-256 key, as the kubelet makes it).
func (n *KubeletNode) Pod(tb testing.TB, ns, name string, sa *corev1.ServiceAccount, signer string) *corev1.Pod {
	tb.Helper()
	p, err := n.c.Client.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa.Name, NodeName: n.Node.Name, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app:1",
				VolumeMounts: []corev1.VolumeMount{{Name: "svid", MountPath: "/var/run/svid"}}}},
			Volumes: []corev1.Volume{{Name: "svid", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{
					SignerName: signer, KeyType: "ECDSAP256", CredentialBundlePath: "credentialbundle.pem"}}}}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// Request creates, as the kubelet, a PodCertificateRequest of pod for
// signer with key's public key (maxSeconds nil: the API's default).
func (n *KubeletNode) Request(tb testing.TB, pod *corev1.Pod, sa *corev1.ServiceAccount, signer string, key crypto.Signer, maxSeconds *int32) *certv1.PodCertificateRequest {
	tb.Helper()
	return n.RequestWithStub(tb, pod, sa, signer, &x509.CertificateRequest{}, key, maxSeconds)
}

// RequestWithStub is Request with a stub CSR made from tmpl, where the
// kubelet uses an empty template: a kubelet that asks for more.
func (n *KubeletNode) RequestWithStub(tb testing.TB, pod *corev1.Pod, sa *corev1.ServiceAccount, signer string, tmpl *x509.CertificateRequest, key crypto.Signer, maxSeconds *int32) *certv1.PodCertificateRequest {
	tb.Helper()
	stub, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		tb.Fatal(err)
	}
	req := &certv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + "-"},
		Spec: certv1.PodCertificateRequestSpec{SignerName: signer, PodName: pod.Name, PodUID: pod.UID,
			ServiceAccountName: sa.Name, ServiceAccountUID: sa.UID, NodeName: types.NodeName(n.Node.Name), NodeUID: n.Node.UID,
			MaxExpirationSeconds: maxSeconds, StubPKCS10Request: stub},
	}
	// The apiserver's admission reads the Pod from its informer, which may
	// not have seen a Pod created a moment ago: a real kubelet asks only
	// for Pods its own watch delivered. Such a refusal is retried briefly.
	var r *certv1.PodCertificateRequest
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r, err = n.Client.CertificatesV1().PodCertificateRequests(pod.Namespace).Create(context.Background(), req, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "while retrieving pod") || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		tb.Fatalf("create PodCertificateRequest as node %s: %v", n.Node.Name, err)
	}
	return r
}

// AnsweredPodCertificate waits up to timeout for r's terminal condition
// (Issued, Denied or Failed) and returns the request as it then is.
func (c *Cluster) AnsweredPodCertificate(tb testing.TB, r *certv1.PodCertificateRequest, timeout time.Duration) (*certv1.PodCertificateRequest, *metav1.Condition) {
	tb.Helper()
	var got *certv1.PodCertificateRequest
	var cond *metav1.Condition
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		if got, err = c.Client.CertificatesV1().PodCertificateRequests(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{}); err != nil {
			return false, err
		}
		cond = PodCertificateTerminal(got)
		return cond != nil, nil
	})
	if err != nil {
		status := "none"
		if got != nil {
			status = fmt.Sprintf("%+v", got.Status)
		}
		tb.Fatalf("PodCertificateRequest %s/%s not answered: %v (status %s)", r.Namespace, r.Name, err, status)
	}
	return got, cond
}

// PodCertificateTerminal is r's terminal condition, or nil.
func PodCertificateTerminal(r *certv1.PodCertificateRequest) *metav1.Condition {
	for i, c := range r.Status.Conditions {
		switch c.Type {
		case certv1.PodCertificateRequestConditionTypeIssued, certv1.PodCertificateRequestConditionTypeDenied, certv1.PodCertificateRequestConditionTypeFailed:
			return &r.Status.Conditions[i]
		}
	}
	return nil
}
