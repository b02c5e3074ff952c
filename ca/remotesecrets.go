package ca

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// RemoteSecretLabel marks Secrets that hold remote clusters' kubeconfigs,
// one data key per cluster id, as Istio's remote secrets do.
const RemoteSecretLabel = "istio/multiCluster"

// RemoteSecretsConfig configures RemoteSecrets.
type RemoteSecretsConfig struct {
	Client    kubernetes.Interface
	Namespace string
	Registry  *Registry
	// Build makes a cluster from its id and kubeconfig.
	Build  func(id string, kubeconfig []byte) (*KubeCluster, error)
	Logger *slog.Logger
}

// RemoteSecrets adds, replaces and removes remote clusters as labelled
// Secrets in one namespace come and go, without a restart.
type RemoteSecrets struct {
	c RemoteSecretsConfig
	// mu guards the clusters each Secret provides and their kubeconfig
	// hashes, so that an unchanged kubeconfig is not rebuilt.
	mu       sync.Mutex
	bySecret map[string]map[string][32]byte
}

// NewRemoteSecrets assembles the watcher; Run starts it.
func NewRemoteSecrets(c RemoteSecretsConfig) *RemoteSecrets {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &RemoteSecrets{c: c, bySecret: map[string]map[string][32]byte{}}
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

// apply makes the registry hold exactly the clusters in data for secret.
func (r *RemoteSecrets) apply(ctx context.Context, secret string, data map[string][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.bySecret[secret]
	now := map[string][32]byte{}
	ids := make([]string, 0, len(data))
	for id := range data {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		sum := sha256.Sum256(data[id])
		now[id] = sum
		if h, ok := old[id]; ok && h == sum {
			continue
		}
		if err := r.start(ctx, id, data[id]); err != nil {
			r.c.Logger.Error("remote cluster not added", "secret", r.c.Namespace+"/"+secret, "cluster", id, "error", err)
			delete(now, id)
			continue
		}
		r.c.Logger.Info("remote cluster added", "secret", r.c.Namespace+"/"+secret, "cluster", id)
	}
	for id := range old {
		if _, ok := now[id]; !ok {
			r.c.Registry.Remove(id)
			r.c.Logger.Info("remote cluster removed", "secret", r.c.Namespace+"/"+secret, "cluster", id)
		}
	}
	if len(now) == 0 {
		delete(r.bySecret, secret)
	} else {
		r.bySecret[secret] = now
	}
}

func (r *RemoteSecrets) start(ctx context.Context, id string, kubeconfig []byte) error {
	if _, local := r.c.Registry.Cluster(""); local && id == r.c.Registry.local {
		return fmt.Errorf("cluster id %q is the local cluster's", id)
	}
	kc, err := r.c.Build(id, kubeconfig)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		if err := kc.Run(cctx); err != nil {
			r.c.Logger.Error("remote cluster stopped", "cluster", id, "error", err)
		}
	}()
	r.c.Registry.Set(kc.Cluster, cancel)
	return nil
}
