package ca

import (
	"fmt"
	"sort"
	"sync"

	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/ca/limit"
)

// Cluster is one Kubernetes cluster whose workloads this CA serves: the
// authenticators that review its tokens and the authorizer that knows its
// Pods. The clusterid request header selects it.
type Cluster struct {
	ID             string
	Authenticators []Authenticator
	Authorizer     *NodeAuthorizer
	// Vouch, when set, vouches for tokens of this cluster before their
	// review (kube.Plausibility): one it vouches for that has not failed
	// from its address is reviewed at once, however many of its
	// neighbours' requests wait for their review turns
	// (limit.Authentication). nil: every token may wait for them.
	Vouch limit.Vouch
	// Ready reports whether the cluster's caches have synced; nil means
	// always ready.
	Ready func() bool
}

// ClusterSource finds a cluster by its id.
type ClusterSource interface {
	// Cluster returns the cluster with id, or the local cluster for "".
	Cluster(id string) (*Cluster, bool)
}

// ClusterSet holds the clusters this CA serves: the local one and the remote ones, which may come and
// go while the CA runs.
type ClusterSet struct {
	mu     sync.RWMutex
	local  string
	byID   map[string]*Cluster
	remove map[string]func()
}

// NewClusterSet returns a cluster set whose local cluster is local.
func NewClusterSet(local *Cluster) *ClusterSet {
	return &ClusterSet{local: local.ID, byID: map[string]*Cluster{local.ID: local}, remove: map[string]func(){}}
}

// Cluster implements ClusterSource.
func (r *ClusterSet) Cluster(id string) (*Cluster, bool) {
	if id == "" {
		id = r.local
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	c, ok := r.byID[id]
	return c, ok
}

// ErrClusterExists is returned, wrapped, when a cluster id is taken.
var ErrClusterExists = kube.ErrClusterExists

// Add adds a remote cluster unless its id is taken (by the local cluster
// or another remote), when it returns an error wrapping ErrClusterExists
// and leaves the set as it was; stop, if not nil, is called when the
// cluster is replaced or removed.
func (r *ClusterSet) Add(c *Cluster, stop func()) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byID[c.ID]; ok {
		return fmt.Errorf("%w: %q", ErrClusterExists, c.ID)
	}
	r.byID[c.ID] = c
	r.remove[c.ID] = stop
	return nil
}

// Set adds or replaces a remote cluster; stop, if not nil, is called when
// it is replaced or removed.
func (r *ClusterSet) Set(c *Cluster, stop func()) {
	r.mu.Lock()
	old := r.remove[c.ID]
	r.byID[c.ID] = c
	r.remove[c.ID] = stop
	r.mu.Unlock()
	if old != nil {
		old()
	}
}

// Remove drops a remote cluster. The local one cannot be removed.
func (r *ClusterSet) Remove(id string) {
	if id == r.local {
		return
	}
	r.mu.Lock()
	stop := r.remove[id]
	delete(r.byID, id)
	delete(r.remove, id)
	r.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// IDs lists the clusters, local first.
func (r *ClusterSet) IDs() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	ids := []string{}
	for id := range r.byID {
		if id != r.local {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return append([]string{r.local}, ids...)
}

// Ready returns nil once the local cluster's caches have synced. Remote
// clusters do not hold readiness hostage: until one syncs, its requests
// get Unavailable.
func (r *ClusterSet) Ready() error {
	r.mu.RLock()
	local := r.byID[r.local]
	r.mu.RUnlock()
	if local.Ready != nil && !local.Ready() {
		return fmt.Errorf("the Pod cache of cluster %q has not synced", r.local)
	}
	return nil
}
