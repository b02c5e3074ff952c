package ca_test

import (
	"context"
	"errors"
	"testing"

	"github.com/meshca/meshca/ca"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

func TestClusterSetAdd(t *testing.T) {
	local := &ca.Cluster{ID: "Kubernetes"}
	reg := ca.NewClusterSet(local)
	stopped := map[string]int{}
	stop := func(name string) func() { return func() { stopped[name]++ } }

	east := &ca.Cluster{ID: "east"}
	if err := reg.Add(east, stop("east")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		c    *ca.Cluster
		keep *ca.Cluster
	}{
		{name: "remote id taken", c: &ca.Cluster{ID: "east"}, keep: east},
		{name: "local id", c: &ca.Cluster{ID: "Kubernetes"}, keep: local},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := reg.Add(tt.c, stop("second"))
			if !errors.Is(err, ca.ErrClusterExists) {
				t.Fatalf("got %v, want ErrClusterExists", err)
			}
			if got, _ := reg.Cluster(tt.c.ID); got != tt.keep {
				t.Error("the first cluster was replaced")
			}
		})
	}
	if len(stopped) != 0 {
		t.Errorf("a refused Add stopped %v", stopped)
	}

	// Set still replaces, stopping the cluster it replaces.
	reg.Set(&ca.Cluster{ID: "east"}, stop("east2"))
	reg.Remove("east")
	if stopped["east"] != 1 || stopped["east2"] != 1 || stopped["second"] != 0 {
		t.Errorf("stops %v", stopped)
	}
	if err := reg.Add(&ca.Cluster{ID: "east"}, nil); err != nil {
		t.Errorf("Add after Remove: %v", err)
	}
}

// TestRemoteClusters: clusters put by the Secret watcher are built, run
// while held, and never take an id another cluster holds.
func TestRemoteClusters(t *testing.T) {
	set := ca.NewClusterSet(&ca.Cluster{ID: "Kubernetes"})
	built := map[string]int{}
	rc := &ca.RemoteClusters{Set: set, Build: func(id string, cfg *rest.Config) (*ca.KubeCluster, error) {
		built[id]++
		return ca.NewKubeCluster(ca.KubeClusterConfig{ID: id, Client: fake.NewClientset()})
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
