package serve

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

// TestRemoteClusters: clusters put by the Secret watcher are built, run
// while held, and never take an id another cluster holds.
func TestRemoteClusters(t *testing.T) {
	set := ca.NewClusterSet(&ca.Cluster{ID: "Kubernetes"})
	built := map[string]int{}
	rc := &remoteClusters{Set: set, Build: func(id string, cfg *rest.Config) (*kubeCluster, error) {
		built[id]++
		return newKubeCluster(kubeClusterConfig{ID: id, Client: fake.NewClientset()})
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := &rest.Config{Host: "https://127.0.0.1:6443"}
	if err := rc.Put(ctx, "east", cfg, false); err != nil {
		t.Fatal(err)
	}
	first, _ := set.Cluster("east")
	for _, id := range []string{"east", "Kubernetes"} {
		if err := rc.Put(ctx, id, cfg, false); !errors.Is(err, ca.ErrClusterExists) {
			t.Errorf("second Put of %s: %v, want ErrClusterExists", id, err)
		}
	}
	if got, _ := set.Cluster("east"); got != first {
		t.Error("a refused Put replaced the cluster")
	}
	if err := rc.Put(ctx, "east", cfg, true); err != nil {
		t.Fatal(err)
	}
	if got, _ := set.Cluster("east"); got == first {
		t.Error("replace kept the old cluster")
	}
	if !rc.Has("east") || !rc.Has("Kubernetes") || rc.Has("west") {
		t.Error("Has disagrees with the set")
	}
	rc.Remove("east")
	if rc.Has("east") {
		t.Error("east still held after Remove")
	}
}

// TestKubeClusterVouches (issue 28, item 3): a cluster vouches for the
// tokens of the Pods its index holds, for its audiences, before their
// review, and for no other.
func TestKubeClusterVouches(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-0", UID: "cart-uid"},
		Spec: corev1.PodSpec{ServiceAccountName: "cart", NodeName: "node-a"}}
	kc, err := newKubeCluster(kubeClusterConfig{ID: "east", Client: fake.NewClientset(pod), Audiences: []string{"mesh-ca"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kc.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(10 * time.Second); !kc.Pods.Synced(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the Pod index did not sync")
		}
	}
	token := func(aud, uid string) string {
		claims, _ := json.Marshal(map[string]any{"aud": []string{aud}, "exp": time.Now().Add(time.Hour).Unix(),
			"kubernetes.io": map[string]any{"namespace": "shop", "serviceaccount": map[string]string{"name": "cart"},
				"pod": map[string]string{"name": "cart-0", "uid": uid}}})
		return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(claims) + ".c2ln"
	}
	if subject, ok := kc.Cluster.Vouch.Plausible(ctx, token("mesh-ca", "cart-uid")); !ok || subject != "east/cart-uid" {
		t.Fatalf("the live Pod's token: %q %v, want east/cart-uid", subject, ok)
	}
	for _, tok := range []string{token("istio-ca", "cart-uid"), token("mesh-ca", "other-uid")} {
		if subject, ok := kc.Cluster.Vouch.Plausible(ctx, tok); ok {
			t.Fatalf("vouched for %s as %q", tok, subject)
		}
	}
}
