package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Names of the objects the load runs against: ztunnel's account, as
// meshca's --trusted-node-accounts names it, and the workloads' namespace.
const (
	systemNS = "istio-system"
	appsNS   = "apps"
	ztunnel  = "ztunnel"
)

// node is one node of the mesh: its ztunnel's bound token and the
// identities of the workloads that run there.
type node struct {
	name  string
	token string
	ids   []spiffeid.ID
}

// makeNodes creates, on the real apiserver, nodes × perNode workloads
// (a service account and one Pod each, on its node) and a ztunnel Pod on
// every node with a token bound to it, as ztunnel's own is.
func makeNodes(ctx context.Context, c kubernetes.Interface, nodes, perNode int) ([]*node, error) {
	for _, ns := range []string{systemNS, appsNS} {
		_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("namespace %s: %w", ns, err)
		}
	}
	if err := serviceAccount(ctx, c, systemNS, ztunnel); err != nil {
		return nil, err
	}
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	out := make([]*node, nodes)
	err := parallel(nodes*perNode, func(i int) error {
		n, slot := i/perNode, i%perNode
		sa := fmt.Sprintf("w-%d-%d", n, slot)
		if err := serviceAccount(ctx, c, appsNS, sa); err != nil {
			return err
		}
		_, err := pod(ctx, c, appsNS, sa+"-0", sa, nodeName(n))
		return err
	})
	if err != nil {
		return nil, err
	}
	for n := range nodes {
		out[n] = &node{name: nodeName(n)}
		for slot := range perNode {
			out[n].ids = append(out[n].ids, spiffeid.RequireFromSegments(td, "ns", appsNS, "sa", fmt.Sprintf("w-%d-%d", n, slot)))
		}
		p, err := pod(ctx, c, systemNS, "ztunnel-"+out[n].name, ztunnel, out[n].name)
		if err != nil {
			return nil, err
		}
		if out[n].token, err = boundToken(ctx, c, p); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func nodeName(n int) string { return fmt.Sprintf("node-%d", n) }

// renewTokens gives every ztunnel a fresh token, as a restarted ztunnel
// has: meshca's TokenReview cache has never seen it.
func renewTokens(ctx context.Context, c kubernetes.Interface, nodes []*node) error {
	for _, n := range nodes {
		p, err := c.CoreV1().Pods(systemNS).Get(ctx, "ztunnel-"+n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.token, err = boundToken(ctx, c, p); err != nil {
			return err
		}
	}
	return nil
}

func serviceAccount(ctx context.Context, c kubernetes.Interface, ns, name string) error {
	_, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service account %s/%s: %w", ns, name, err)
	}
	return nil
}

// pod creates a Pod of sa on node; without a kubelet it stays Pending,
// which is all a bound token and meshca's Pod index need.
func pod(ctx context.Context, c kubernetes.Interface, ns, name, sa, node string) (*corev1.Pod, error) {
	p, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", ns, name, err)
	}
	return p, nil
}

// boundToken mints a one-hour token with audience istio-ca bound to p.
func boundToken(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) (string, error) {
	secs := int64(time.Hour / time.Second)
	tr, err := c.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctx, p.Spec.ServiceAccountName, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{"istio-ca"}, ExpirationSeconds: &secs,
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenRequest for %s/%s: %w", p.Namespace, p.Name, err)
	}
	return tr.Status.Token, nil
}
