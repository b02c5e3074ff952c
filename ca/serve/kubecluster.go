package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/kube"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// kubeClusterConfig describes one cluster whose apiserver reviews tokens
// and whose Pods authorize node proxies.
type kubeClusterConfig struct {
	ID                  string
	Client              kubernetes.Interface
	TrustDomain         spiffeid.TrustDomain
	Audiences           []string
	TrustedNodeAccounts map[string]bool
	NodeProxyDeny       *ca.DenyList // ca.NodeAuthorizer.NodeProxyDeny
	CacheTTL            time.Duration
	CacheSize           int
	NegativeTTL         time.Duration
	CacheMetrics        *kube.TokenCacheMetrics
	// Now is the token cache's clock; time.Now when nil.
	Now func() time.Time
}

// kubeCluster is a ca.Cluster backed by a Kubernetes apiserver: a cached
// TokenReviewer and a NodeAuthorizer over a Pod index whose deletions
// invalidate the cache, and which vouches for the tokens of the Pods it
// holds before their review (kube.Plausibility).
type kubeCluster struct {
	Cluster *ca.Cluster
	Client  kubernetes.Interface
	Tokens  *kube.CachedTokenReviewer
	Pods    *kube.PodIndex
}

// newKubeCluster assembles the cluster; Run starts its Pod index.
func newKubeCluster(c kubeClusterConfig) (*kubeCluster, error) {
	if c.ID == "" {
		return nil, errors.New("serve: cluster id is required")
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
	return &kubeCluster{
		Client: c.Client,
		Cluster: &ca.Cluster{
			ID:             c.ID,
			Authenticators: []ca.Authenticator{&ca.TokenAuthenticator{Reviewer: tokens}},
			Authorizer:     &ca.NodeAuthorizer{TrustDomain: c.TrustDomain, TrustedNodeAccounts: c.TrustedNodeAccounts, NodeProxyDeny: c.NodeProxyDeny, Pods: pods},
			Vouch:          &kube.Plausibility{Cluster: c.ID, Pods: pods, Audiences: c.Audiences, Now: c.Now},
			Ready:          pods.Synced,
		},
		Tokens: tokens,
		Pods:   pods,
	}, nil
}

// Run runs the Pod index until ctx ends.
func (k *kubeCluster) Run(ctx context.Context) error {
	return k.Pods.Run(ctx)
}

// remoteClusters lets kube.RemoteSecrets put the clusters it finds into a
// ca.ClusterSet: it builds each with Build and runs it while it is held.
type remoteClusters struct {
	Set *ca.ClusterSet
	// Build makes a cluster from its id and sanitised client configuration.
	Build  func(id string, cfg *rest.Config) (*kubeCluster, error)
	Logger *slog.Logger
}

// Has implements kube.Clusters.
func (r *remoteClusters) Has(id string) bool {
	_, ok := r.Set.Cluster(id)
	return ok && id != ""
}

// Put implements kube.Clusters.
func (r *remoteClusters) Put(ctx context.Context, id string, cfg *rest.Config, replace bool) error {
	kc, err := r.Build(id, cfg)
	if err != nil {
		return fmt.Errorf("serve: building cluster %s: %w", id, err)
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
			r.logger().Error("remote cluster stopped", "cluster", id, "error", err)
		}
	}()
	return nil
}

// Remove implements kube.Clusters.
func (r *remoteClusters) Remove(id string) { r.Set.Remove(id) }

func (r *remoteClusters) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.Default()
	}
	return r.Logger
}
