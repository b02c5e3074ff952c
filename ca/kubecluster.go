package ca

import (
	"context"
	"errors"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
)

// KubeClusterConfig describes one cluster whose apiserver reviews tokens
// and whose Pods authorize node proxies.
type KubeClusterConfig struct {
	ID                  string
	Client              kubernetes.Interface
	TrustDomain         spiffeid.TrustDomain
	Audiences           []string
	TrustedNodeAccounts map[string]bool
	CacheTTL            time.Duration
	CacheSize           int
	NegativeTTL         time.Duration
	CacheMetrics        *TokenCacheMetrics
}

// KubeCluster is a Cluster backed by a Kubernetes apiserver: a cached
// TokenReviewer and a NodeAuthorizer over a Pod index whose deletions
// invalidate the cache.
type KubeCluster struct {
	Cluster *Cluster
	Client  kubernetes.Interface
	Tokens  *CachedTokenReviewer
	Pods    *PodIndex
}

// NewKubeCluster assembles the cluster; Run starts its Pod index.
func NewKubeCluster(c KubeClusterConfig) (*KubeCluster, error) {
	if c.ID == "" {
		return nil, errors.New("ca: cluster id is required")
	}
	pods, err := NewPodIndex(PodIndexConfig{Client: c.Client})
	if err != nil {
		return nil, err
	}
	tokens := NewCachedTokenReviewer(TokenCacheConfig{
		Reviewer:    &TokenReviewer{TrustDomain: c.TrustDomain, Client: c.Client, Audiences: c.Audiences},
		Audiences:   c.Audiences,
		TTL:         c.CacheTTL,
		MaxEntries:  c.CacheSize,
		NegativeTTL: c.NegativeTTL,
		Metrics:     c.CacheMetrics,
		Cluster:     c.ID,
	})
	pods.OnDelete(func(p PodInfo) { tokens.InvalidatePod(p.UID) })
	return &KubeCluster{
		Client: c.Client,
		Cluster: &Cluster{
			ID:             c.ID,
			Authenticators: []Authenticator{tokens},
			Authorizer:     &NodeAuthorizer{TrustDomain: c.TrustDomain, TrustedNodeAccounts: c.TrustedNodeAccounts, Pods: pods},
			Ready:          pods.Synced,
		},
		Tokens: tokens,
		Pods:   pods,
	}, nil
}

// Run runs the Pod index until ctx ends.
func (k *KubeCluster) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return k.Pods.Run(ctx) })
	return g.Wait()
}
