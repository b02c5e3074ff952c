package ca

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// RemoteSecretLabel marks Secrets that hold remote clusters' kubeconfigs,
// one data key per cluster id, as Istio's remote secrets do.
const RemoteSecretLabel = "istio/multiCluster"

// Reasons a remote cluster from a Secret is refused, besides the
// KubeconfigFeature ones.
const (
	reasonInvalidKubeconfig  = "invalid_kubeconfig"
	reasonDuplicateClusterID = "duplicate_cluster_id"
	reasonBuildFailed        = "build_failed"
)

const logSecret = "secret"

// RemoteSecretsConfig configures RemoteSecrets.
type RemoteSecretsConfig struct {
	Client    kubernetes.Interface
	Namespace string
	Registry  *Registry
	// Allow names the kubeconfig features a Secret may use; see
	// SanitizeKubeconfig. The zero value allows none.
	Allow KubeconfigAllow
	// Build makes a cluster from its id and the sanitised client
	// configuration of its kubeconfig.
	Build   func(id string, cfg *rest.Config) (*KubeCluster, error)
	Metrics *RemoteSecretsMetrics
	Logger  *slog.Logger
}

// RemoteSecrets adds, replaces and removes remote clusters as labelled
// Secrets in one namespace come and go, without a restart. A cluster id
// belongs to the first Secret that provides it with an acceptable
// kubeconfig; another Secret naming the same id, or the id of the local
// cluster or of a --remote-cluster, is refused. When the owner drops the
// id, the first other Secret (by name) that names it takes it over.
type RemoteSecrets struct {
	c  RemoteSecretsConfig
	mu sync.Mutex
	// secrets holds the data last seen in each Secret, so that a refused
	// duplicate can take its id over when the owner lets it go.
	secrets map[string]map[string][]byte
	// owners maps the ids added here to the Secret that provided them.
	owners map[string]owner
}

type owner struct {
	secret string
	// sum is the hash of the kubeconfig the cluster was built from, so
	// that an unchanged one is not rebuilt.
	sum [32]byte
}

// NewRemoteSecrets assembles the watcher; Run starts it.
func NewRemoteSecrets(c RemoteSecretsConfig) *RemoteSecrets {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &RemoteSecrets{c: c, secrets: map[string]map[string][]byte{}, owners: map[string]owner{}}
}

// Run watches the Secrets until ctx ends; the clusters it started stop
// with it.
func (r *RemoteSecrets) Run(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(r.c.Client, 0,
		informers.WithNamespace(r.c.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = RemoteSecretLabel + "=true" }))
	inf := f.Core().V1().Secrets().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.sync(ctx, obj) },
		UpdateFunc: func(_, obj any) { r.sync(ctx, obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if s, ok := obj.(*corev1.Secret); ok {
				r.apply(ctx, s.Name, nil)
			}
		},
	})
	if err != nil {
		return err
	}
	f.Start(ctx.Done())
	<-ctx.Done()
	f.Shutdown()
	return nil
}

func (r *RemoteSecrets) sync(ctx context.Context, obj any) {
	if s, ok := obj.(*corev1.Secret); ok {
		r.apply(ctx, s.Name, s.Data)
	}
}

// apply makes the registry hold the clusters in data that secret may own.
func (r *RemoteSecrets) apply(ctx context.Context, secret string, data map[string][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(data) == 0 {
		delete(r.secrets, secret)
	} else {
		r.secrets[secret] = data
	}
	var freed []string
	for _, id := range kubeconfigNames(r.owners) {
		if _, still := data[id]; r.owners[id].secret == secret && !still {
			r.release(secret, id)
			freed = append(freed, id)
		}
	}
	for _, id := range kubeconfigNames(data) {
		if r.claim(ctx, secret, id, data[id]) {
			freed = append(freed, id)
		}
	}
	for _, id := range freed {
		for _, other := range kubeconfigNames(r.secrets) {
			if _, taken := r.owners[id]; taken {
				break
			}
			if kubeconfig, ok := r.secrets[other][id]; ok && other != secret {
				r.claim(ctx, other, id, kubeconfig)
			}
		}
	}
}

// claim adds or replaces the cluster id of secret, unless another owns
// the id. It reports whether secret lost an id it owned, because its new
// kubeconfig is refused.
func (r *RemoteSecrets) claim(ctx context.Context, secret, id string, kubeconfig []byte) (lost bool) {
	log := r.c.Logger.With(logSecret, r.c.Namespace+"/"+secret, logCluster, id)
	sum := sha256.Sum256(kubeconfig)
	o, taken := r.owners[id]
	mine := taken && o.secret == secret
	_, registered := r.c.Registry.Cluster(id)
	switch {
	case mine && o.sum == sum:
		return false
	case taken && !mine:
		r.refuse(log, reasonDuplicateClusterID, fmt.Errorf("cluster id is owned by Secret %s/%s", r.c.Namespace, o.secret))
		return false
	case !taken && id == r.c.Registry.local:
		r.refuse(log, reasonDuplicateClusterID, errors.New("cluster id is the local cluster's"))
		return false
	case !taken && registered:
		r.refuse(log, reasonDuplicateClusterID, errors.New("cluster id is a --remote-cluster's"))
		return false
	}
	kc, reason, err := r.build(id, kubeconfig)
	if err != nil {
		r.refuse(log, reason, err)
		if mine {
			r.release(secret, id)
		}
		return mine
	}
	cctx, cancel := context.WithCancel(ctx)
	if mine {
		r.c.Registry.Set(kc.Cluster, cancel)
	} else if err := r.c.Registry.Add(kc.Cluster, cancel); err != nil {
		cancel()
		r.refuse(log, reasonDuplicateClusterID, err)
		return false
	}
	r.owners[id] = owner{secret: secret, sum: sum}
	go func() {
		if err := kc.Run(cctx); err != nil {
			r.c.Logger.Error("remote cluster stopped", logCluster, id, "error", err)
		}
	}()
	if mine {
		log.Info("remote cluster replaced")
	} else {
		log.Info("remote cluster added")
	}
	return false
}

// build sanitises the kubeconfig and builds the cluster; on failure it
// also returns the metric reason.
func (r *RemoteSecrets) build(id string, kubeconfig []byte) (*KubeCluster, string, error) {
	cfg, err := SanitizeKubeconfig(kubeconfig, r.c.Allow)
	if err != nil {
		reason := reasonInvalidKubeconfig
		if ke := (*KubeconfigError)(nil); errors.As(err, &ke) {
			reason = ke.Reason()
		}
		return nil, reason, err
	}
	kc, err := r.c.Build(id, cfg)
	if err != nil {
		return nil, reasonBuildFailed, err
	}
	return kc, "", nil
}

func (r *RemoteSecrets) release(secret, id string) {
	r.c.Registry.Remove(id)
	delete(r.owners, id)
	r.c.Logger.Info("remote cluster removed", logSecret, r.c.Namespace+"/"+secret, logCluster, id)
}

func (r *RemoteSecrets) refuse(log *slog.Logger, reason string, err error) {
	log.Error("remote cluster refused", logReason, reason, "error", err)
	r.c.Metrics.refused(reason)
}

// RemoteSecretsMetrics count the remote clusters refused, by reason.
type RemoteSecretsMetrics struct {
	refusals *prometheus.CounterVec
}

// NewRemoteSecretsMetrics registers the collector; every reason starts
// at zero.
func NewRemoteSecretsMetrics(reg prometheus.Registerer) *RemoteSecretsMetrics {
	m := &RemoteSecretsMetrics{refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshca_remote_cluster_refused_total",
		Help: "Remote clusters from Secrets that were not added or were removed, by reason: a kubeconfig feature not allowed by --" +
			KubeconfigAllowFlag + ", " + reasonInvalidKubeconfig + ", " + reasonBuildFailed + " or " + reasonDuplicateClusterID + ".",
	}, []string{logReason})}
	for _, f := range KubeconfigFeatures {
		m.refusals.WithLabelValues(f.Reason())
	}
	for _, reason := range []string{reasonInvalidKubeconfig, reasonDuplicateClusterID, reasonBuildFailed} {
		m.refusals.WithLabelValues(reason)
	}
	reg.MustRegister(m.refusals)
	return m
}

func (m *RemoteSecretsMetrics) refused(reason string) {
	if m != nil {
		m.refusals.WithLabelValues(reason).Inc()
	}
}
