package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Namespace creates a namespace with a unique name for tb and deletes it
// at cleanup.
func (c *Cluster) Namespace(tb testing.TB, prefix string) string {
	tb.Helper()
	ns, err := c.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create namespace: %v", err)
	}
	tb.Cleanup(func() {
		_ = c.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// ServiceAccount creates a service account (there is no controller
// manager, so not even "default" exists).
func (c *Cluster) ServiceAccount(tb testing.TB, ns, name string) *corev1.ServiceAccount {
	tb.Helper()
	sa, err := c.Client.CoreV1().ServiceAccounts(ns).Create(context.Background(), &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create service account: %v", err)
	}
	return sa
}

// Pod creates a Pod running sa, scheduled on node. Without a kubelet it
// stays Pending, which is all a TokenRequest binding needs.
func (c *Cluster) Pod(tb testing.TB, ns, name, sa, node string) *corev1.Pod {
	tb.Helper()
	p, err := c.Client.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			ServiceAccountName:           sa,
			NodeName:                     node,
			AutomountServiceAccountToken: new(bool),
			Containers:                   []corev1.Container{{Name: "app", Image: "example.invalid/app:1"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("create pod: %v", err)
	}
	return p
}

// DeletePod deletes a Pod at once (no kubelet would ever finish a graceful
// delete).
func (c *Cluster) DeletePod(tb testing.TB, ns, name string) {
	tb.Helper()
	zero := int64(0)
	if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		tb.Fatalf("delete pod: %v", err)
	}
}

// Token mints a token for sa with TokenRequest, bound to pod when pod is
// not empty.
func (c *Cluster) Token(tb testing.TB, ns, sa, pod string, audiences []string, ttl time.Duration) string {
	tb.Helper()
	secs := int64(ttl / time.Second)
	req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &secs}}
	if pod != "" {
		p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
		if err != nil {
			tb.Fatalf("get pod: %v", err)
		}
		req.Spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod, UID: p.UID}
	}
	tr, err := c.Client.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa, req, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("TokenRequest: %v", err)
	}
	return tr.Status.Token
}

// WriteToken writes token to a file in a fresh temporary directory and
// returns its path.
func WriteToken(tb testing.TB, token string) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

// Workload is a namespace, service account and Pod with a bound token.
type Workload struct {
	Namespace, ServiceAccount, Pod, Node string
	Token                                string
}

// NewWorkload creates a service account and a Pod on node in ns and mints
// a bound token with audience istio-ca.
func (c *Cluster) NewWorkload(tb testing.TB, ns, sa, node string) *Workload {
	tb.Helper()
	c.ServiceAccount(tb, ns, sa)
	pod := fmt.Sprintf("%s-%d", sa, time.Now().UnixNano()%100000)
	c.Pod(tb, ns, pod, sa, node)
	return &Workload{Namespace: ns, ServiceAccount: sa, Pod: pod, Node: node,
		Token: c.Token(tb, ns, sa, pod, []string{"istio-ca"}, time.Hour)}
}
