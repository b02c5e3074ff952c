package serve

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/secretstore"
)

// Clusters says which Kubernetes clusters meshca serves and how it talks
// to them.
type Clusters struct {
	// LocalID names the local cluster (the clusterid header's default).
	LocalID string
	// LocalKubeconfig is the local cluster's kubeconfig file; empty uses
	// the in-cluster configuration.
	LocalKubeconfig string
	// Remotes maps cluster ids to the kubeconfig files the operator gave.
	Remotes map[string]string
	// SecretNamespace is where Secrets labelled kube.RemoteSecretLabel
	// are watched for remote clusters; empty disables the watch.
	SecretNamespace string
	// KubeconfigAllow is what a Secret's kubeconfig may use.
	KubeconfigAllow kube.KubeconfigAllow
	// Audiences, node accounts, the identities denied to node proxies
	// and the token cache, as in kubeClusterConfig. meshca's own account
	// is denied besides NodeProxyDeny's (OwnAccount).
	Audiences             []string
	NodeAccounts          map[string]bool
	NodeProxyDeny         *ca.DenyList
	CacheTTL, NegativeTTL time.Duration
	CacheSize             int
	// NewClient makes a cluster's client from its configuration;
	// kubernetes.NewForConfig when nil.
	NewClient func(*rest.Config) (kubernetes.Interface, error)
}

// clusterParts are the assembled clusters and the loops that feed them.
type clusterParts struct {
	set         *ca.ClusterSet
	localClient kubernetes.Interface
	// watch follows the local apiserver for the Pod informer: the
	// pod-cache readiness check and its warnings.
	watch   *apiWatch
	runners []func(context.Context) error
}

func newClusters(c Clusters, td spiffeid.TrustDomain, reg prometheus.Registerer, log *slog.Logger) (*clusterParts, error) {
	if c.NewClient == nil {
		c.NewClient = func(cfg *rest.Config) (kubernetes.Interface, error) { return kubernetes.NewForConfig(cfg) }
	}
	metrics := kube.NewTokenCacheMetrics(reg)
	build := func(id string, cfg *rest.Config) (*kubeCluster, error) {
		cfg.QPS, cfg.Burst = 200, 400
		client, err := c.NewClient(cfg)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: kubernetes client: %w", id, err)
		}
		return newKubeCluster(kubeClusterConfig{
			ID: id, Client: client, TrustDomain: td, Audiences: c.Audiences, TrustedNodeAccounts: c.NodeAccounts, NodeProxyDeny: c.NodeProxyDeny,
			CacheTTL: c.CacheTTL, CacheSize: c.CacheSize, NegativeTTL: c.NegativeTTL, CacheMetrics: metrics,
		})
	}
	fromFile := func(id, kubeconfig string) (*kubeCluster, error) {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: kubernetes client configuration: %w", id, err)
		}
		return build(id, cfg)
	}
	localCfg, err := clientcmd.BuildConfigFromFlags("", c.LocalKubeconfig)
	if err != nil {
		return nil, &FieldError{Field: "kubeconfig", Err: fmt.Errorf("cluster %s: kubernetes client configuration: %w", c.LocalID, err)}
	}
	// Before any cluster is built: every cluster's authorizer denies it.
	if c.NodeProxyDeny, err = denyOwnAccount(c.NodeProxyDeny, localCfg, log); err != nil {
		return nil, &FieldError{Field: "kubeconfig", Err: err}
	}
	local, err := build(c.LocalID, localCfg)
	if err != nil {
		return nil, &FieldError{Field: "kubeconfig", Err: err}
	}
	watch := newAPIWatch(c.LocalID, local.Pods.Synced, func(ctx context.Context) error {
		_, err := local.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 1})
		return err
	}, log, nil)
	if err := local.Pods.OnWatchError(watch.fail); err != nil {
		return nil, err
	}
	p := &clusterParts{set: ca.NewClusterSet(local.Cluster), localClient: local.Client, watch: watch,
		runners: []func(context.Context) error{local.Run, watch.Run}}
	ids := make([]string, 0, len(c.Remotes))
	for id := range c.Remotes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		rc, err := fromFile(id, c.Remotes[id])
		if err != nil {
			return nil, &FieldError{Field: "remote-cluster", Err: err}
		}
		if err := p.set.Add(rc.Cluster, nil); err != nil {
			return nil, &FieldError{Field: "remote-cluster", Err: err}
		}
		p.runners = append(p.runners, rc.Run)
	}
	if c.SecretNamespace == "" {
		return p, nil
	}
	secrets := kube.NewRemoteSecrets(kube.RemoteSecretsConfig{
		Client: local.Client, Namespace: c.SecretNamespace, Logger: log,
		Clusters: &remoteClusters{Set: p.set, Build: build, Logger: log},
		Allow:    c.KubeconfigAllow, Metrics: kube.NewRemoteSecretsMetrics(reg),
	})
	p.runners = append(p.runners, secrets.Run)
	return p, nil
}

// stateCallTimeout bounds each call of the client of the state Secret.
const stateCallTimeout = 30 * time.Second

// stateSecret opens the CA state Secret "namespace/name" of the local
// cluster.
func (c Clusters) stateSecret(secret string) (keymgr.StateStore, error) {
	ns, name, ok := strings.Cut(secret, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("%q is not namespace/name", secret)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.LocalKubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	// client-go's default 5/s would make the first requests after a
	// restart (each reads the state before it records its leaf) queue.
	cfg.QPS, cfg.Burst = 50, 100
	// Requests record their leaves under their own deadline; the
	// background readers of the state (the follower, automatic rotation,
	// its Lease) have none, so each call gets one here.
	cfg.Timeout = stateCallTimeout
	newClient := c.NewClient
	if newClient == nil {
		newClient = func(cfg *rest.Config) (kubernetes.Interface, error) { return kubernetes.NewForConfig(cfg) }
	}
	client, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	return &secretstore.Store{Client: client, Namespace: ns, Name: name}, nil
}
