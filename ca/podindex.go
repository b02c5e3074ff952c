package ca

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// PodInfo is what authorization needs to know about a Pod.
type PodInfo struct {
	Namespace, Name, UID string
	ServiceAccount, Node string
	Failed               bool
}

const indexByAccountNode = "ns/sa/node"

func accountNodeKey(ns, sa, node string) string { return ns + "/" + sa + "/" + node }

// PodIndex is a watch-fed cache of Pods, indexed by (namespace, service
// account, node). A miss is confirmed against the apiserver once, rate
// limited, so that informer lag never turns into a hard denial.
type PodIndex struct {
	api      APIPods
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	limiter  *rate.Limiter
	onDelete []func(PodInfo)
}

// PodIndexConfig configures a PodIndex.
type PodIndexConfig struct {
	Client kubernetes.Interface
	// LookupRate bounds apiserver confirmations of index misses (per
	// second, burst 4x); 20/s when zero.
	LookupRate float64
}

// NewPodIndex assembles the index; Run starts it.
func NewPodIndex(c PodIndexConfig) (*PodIndex, error) {
	if c.LookupRate <= 0 {
		c.LookupRate = 20
	}
	f := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithTransform(slimPod))
	inf := f.Core().V1().Pods().Informer()
	err := inf.AddIndexers(cache.Indexers{indexByAccountNode: func(obj any) ([]string, error) {
		p := podInfo(obj)
		if p == nil || p.Node == "" {
			return nil, nil
		}
		return []string{accountNodeKey(p.Namespace, p.ServiceAccount, p.Node)}, nil
	}})
	if err != nil {
		return nil, fmt.Errorf("ca: pod index: %w", err)
	}
	return &PodIndex{api: APIPods{Client: c.Client}, factory: f, informer: inf,
		limiter: rate.NewLimiter(rate.Limit(c.LookupRate), int(4*c.LookupRate))}, nil
}

// OnDelete registers f to run when a Pod is deleted or replaced (same
// name, new UID). Call before Run.
func (x *PodIndex) OnDelete(f func(PodInfo)) {
	x.onDelete = append(x.onDelete, f)
}

// Run starts the informer and blocks until ctx ends.
func (x *PodIndex) Run(ctx context.Context) error {
	_, err := x.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			o, n := podInfo(oldObj), podInfo(newObj)
			if o != nil && n != nil && o.UID != n.UID {
				x.deleted(*o)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p := podInfo(obj); p != nil {
				x.deleted(*p)
			}
		},
	})
	if err != nil {
		return err
	}
	x.factory.Start(ctx.Done())
	<-ctx.Done()
	x.factory.Shutdown()
	return nil
}

func (x *PodIndex) deleted(p PodInfo) {
	for _, f := range x.onDelete {
		f(p)
	}
}

// Synced reports whether the initial list has been loaded.
func (x *PodIndex) Synced() bool { return x.informer.HasSynced() }

// ErrNotSynced is returned before the first list completes.
var ErrNotSynced = errors.New("pod index has not synced yet")

// Pod returns a Pod by name, from the index or, on a miss, the apiserver.
func (x *PodIndex) Pod(ctx context.Context, ns, name string) (*PodInfo, error) {
	if !x.Synced() {
		return nil, ErrNotSynced
	}
	if obj, ok, _ := x.informer.GetIndexer().GetByKey(ns + "/" + name); ok {
		return podInfo(obj), nil
	}
	if err := x.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	return x.api.Pod(ctx, ns, name)
}

// OnNode returns the non-Failed Pods of ns/sa on node. A miss in the index
// is confirmed against the apiserver with one bounded list.
func (x *PodIndex) OnNode(ctx context.Context, ns, sa, node string) ([]PodInfo, error) {
	if !x.Synced() {
		return nil, ErrNotSynced
	}
	objs, err := x.informer.GetIndexer().ByIndex(indexByAccountNode, accountNodeKey(ns, sa, node))
	if err != nil {
		return nil, err
	}
	if out := running(objs); len(out) > 0 {
		return out, nil
	}
	if err := x.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	return x.api.OnNode(ctx, ns, sa, node)
}

// APIPods answers Pod questions from the apiserver directly, without a
// cache: the index's fallback, and `meshca explain`.
type APIPods struct {
	Client kubernetes.Interface
}

// Pod implements PodSource.
func (a APIPods) Pod(ctx context.Context, ns, name string) (*PodInfo, error) {
	p, err := a.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return podInfo(p), nil
}

// OnNode implements PodSource with one bounded list by field selector.
func (a APIPods) OnNode(ctx context.Context, ns, sa, node string) ([]PodInfo, error) {
	list, err := a.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.AndSelectors(
			fields.OneTermEqualSelector("spec.nodeName", node),
			fields.OneTermEqualSelector("spec.serviceAccountName", sa),
		).String(),
		Limit: 16,
	})
	if err != nil {
		return nil, err
	}
	objs := make([]any, 0, len(list.Items))
	for i := range list.Items {
		objs = append(objs, &list.Items[i])
	}
	return running(objs), nil
}

func running(objs []any) []PodInfo {
	var out []PodInfo
	for _, o := range objs {
		if p := podInfo(o); p != nil && !p.Failed {
			out = append(out, *p)
		}
	}
	return out
}

func podInfo(obj any) *PodInfo {
	switch p := obj.(type) {
	case *podRecord:
		return &PodInfo{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), ServiceAccount: p.serviceAccount, Node: p.node, Failed: p.failed}
	case *corev1.Pod:
		return &PodInfo{
			Namespace: p.Namespace, Name: p.Name, UID: string(p.UID),
			ServiceAccount: p.Spec.ServiceAccountName, Node: p.Spec.NodeName,
			Failed: p.Status.Phase == corev1.PodFailed,
		}
	}
	return nil
}

// podRecord is what the index keeps of a Pod: its identity and the three
// fields authorization reads, so that 100,000 Pods fit in a small heap.
type podRecord struct {
	metav1.ObjectMeta
	serviceAccount, node string
	failed               bool
}

// GetObjectKind implements runtime.Object.
func (p *podRecord) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object.
func (p *podRecord) DeepCopyObject() runtime.Object {
	c := *p
	p.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	return &c
}

// slimPod is the informer's transform: it replaces a Pod by its podRecord.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &podRecord{
		ObjectMeta:     metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion},
		serviceAccount: p.Spec.ServiceAccountName,
		node:           p.Spec.NodeName,
		failed:         p.Status.Phase == corev1.PodFailed,
	}, nil
}
