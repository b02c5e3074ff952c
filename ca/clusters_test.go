package ca_test

import (
	"errors"
	"testing"

	"github.com/meshca/meshca/ca"
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
