package serve

import (
	"context"
	"errors"
	"testing"

	"github.com/meshca/meshca/ca"
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
