package kube

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

// Clusters is where RemoteSecrets puts the clusters it finds: package
// ca's cluster set, which knows how to build and run one.
type Clusters interface {
	// Has reports whether a cluster holds id.
	Has(id string) bool
	// Put builds cluster id from the sanitised cfg and runs it until ctx
	// ends or it is removed. It adds a new id, failing with an error that
	// wraps ErrClusterExists when id is held, or, with replace, replaces
	// the cluster this watcher put there before.
	Put(ctx context.Context, id string, cfg *rest.Config, replace bool) error
	// Remove stops and removes cluster id.
	Remove(id string)
}

// ErrClusterExists: another cluster already holds the id.
var ErrClusterExists = errors.New("cluster id already held")

// RemoteSecretsConfig configures RemoteSecrets.
type RemoteSecretsConfig struct {
	Client    kubernetes.Interface
	Namespace string
	Clusters  Clusters
	// Allow names the kubeconfig features a Secret may use; see
	// SanitizeKubeconfig. The zero value allows none.
	Allow   KubeconfigAllow
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
	switch {
	case mine && o.sum == sum:
		return false
	case taken && !mine:
		r.refuse(log, reasonDuplicateClusterID, fmt.Errorf("cluster id is owned by Secret %s/%s", r.c.Namespace, o.secret))
		return false
	case !taken && r.c.Clusters.Has(id):
		r.refuse(log, reasonDuplicateClusterID, errors.New("cluster id is the local cluster's or a --remote-cluster's"))
		return false
	}
	cfg, err := SanitizeKubeconfig(kubeconfig, r.c.Allow)
	if err == nil {
		err = r.c.Clusters.Put(ctx, id, cfg, mine)
	}
	if err != nil {
		r.refuse(log, refusalReason(err), err)
		if mine {
			r.release(secret, id)
		}
		return mine
	}
	r.owners[id] = owner{secret: secret, sum: sum}
	if mine {
		log.Info("remote cluster replaced")
	} else {
		log.Info("remote cluster added")
	}
	return false
}

// refusalReason is the metric label of a cluster that could not be put.
func refusalReason(err error) string {
	var ke *KubeconfigError
	switch {
	case errors.As(err, &ke):
		return ke.Reason()
	case errors.Is(err, ErrClusterExists):
		return reasonDuplicateClusterID
	}
	return reasonBuildFailed
}

func (r *RemoteSecrets) release(secret, id string) {
	r.c.Clusters.Remove(id)
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
