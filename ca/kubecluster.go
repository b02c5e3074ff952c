package ca

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/meshca/meshca/ca/kube"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// KubeClusterConfig describes one cluster whose apiserver reviews tokens
// and whose Pods authorize node proxies.
type KubeClusterConfig struct {
	ID                  string
	Client              kubernetes.Interface
	TrustDomain         spiffeid.TrustDomain
	Audiences           []string
	TrustedNodeAccounts map[string]bool
	NodeProxyDeny       map[string]bool // NodeAuthorizer.NodeProxyDeny
	CacheTTL            time.Duration
	CacheSize           int
	NegativeTTL         time.Duration
	CacheMetrics        *kube.TokenCacheMetrics
	// Now is the token cache's clock; time.Now when nil.
	Now func() time.Time
}

// KubeCluster is a Cluster backed by a Kubernetes apiserver: a cached
// TokenReviewer and a NodeAuthorizer over a Pod index whose deletions
// invalidate the cache.
type KubeCluster struct {
	Cluster *Cluster
	Client  kubernetes.Interface
	Tokens  *kube.CachedTokenReviewer
	Pods    *kube.PodIndex
}

// NewKubeCluster assembles the cluster; Run starts its Pod index.
func NewKubeCluster(c KubeClusterConfig) (*KubeCluster, error) {
	if c.ID == "" {
		return nil, errors.New("ca: cluster id is required")
	}
	pods, err := kube.NewPodIndex(kube.PodIndexConfig{Client: c.Client})
	if err != nil {
		return nil, err
	}
	tokens := kube.NewCachedTokenReviewer(kube.TokenCacheConfig{
		Reviewer:    &kube.TokenReviewer{TrustDomain: c.TrustDomain, Client: c.Client, Audiences: c.Audiences},
		Audiences:   c.Audiences,
		TTL:         c.CacheTTL,
		MaxEntries:  c.CacheSize,
		NegativeTTL: c.NegativeTTL,
		Metrics:     c.CacheMetrics,
		Cluster:     c.ID,
		Now:         c.Now,
	})
	pods.OnDelete(func(p kube.PodInfo) { tokens.InvalidatePod(p.UID) })
	return &KubeCluster{
		Client: c.Client,
		Cluster: &Cluster{
			ID:             c.ID,
			Authenticators: []Authenticator{&TokenAuthenticator{Reviewer: tokens}},
			Authorizer:     &NodeAuthorizer{TrustDomain: c.TrustDomain, TrustedNodeAccounts: c.TrustedNodeAccounts, NodeProxyDeny: c.NodeProxyDeny, Pods: pods},
			Ready:          pods.Synced,
		},
		Tokens: tokens,
		Pods:   pods,
	}, nil
}

// Run runs the Pod index until ctx ends.
func (k *KubeCluster) Run(ctx context.Context) error {
	return k.Pods.Run(ctx)
}

// RemoteClusters lets kube.RemoteSecrets put the clusters it finds into a
// ClusterSet: it builds each with Build and runs it while it is held.
type RemoteClusters struct {
	Set *ClusterSet
	// Build makes a cluster from its id and sanitised client configuration.
	Build  func(id string, cfg *rest.Config) (*KubeCluster, error)
	Logger *slog.Logger
}

// Has implements kube.Clusters.
func (r *RemoteClusters) Has(id string) bool {
	_, ok := r.Set.Cluster(id)
	return ok && id != ""
}

// Put implements kube.Clusters.
func (r *RemoteClusters) Put(ctx context.Context, id string, cfg *rest.Config, replace bool) error {
	kc, err := r.Build(id, cfg)
	if err != nil {
		return fmt.Errorf("ca: building cluster %s: %w", id, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	if replace {
		r.Set.Set(kc.Cluster, cancel)
	} else if err := r.Set.Add(kc.Cluster, cancel); err != nil {
		cancel()
		return err
	}
	go func() {
		if err := kc.Run(cctx); err != nil {
			r.logger().Error("remote cluster stopped", logCluster, id, "error", err)
		}
	}()
	return nil
}

// Remove implements kube.Clusters.
func (r *RemoteClusters) Remove(id string) { r.Set.Remove(id) }

func (r *RemoteClusters) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.Default()
	}
	return r.Logger
}
