package kube

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
	// Terminated: the Pod's phase is Failed or Succeeded; its containers
	// will not run again.
	Terminated bool
	// Deleting: the Pod has a deletion timestamp.
	Deleting bool
}

// Live reports whether the Pod runs or may still run: not terminated and
// not being deleted.
func (p *PodInfo) Live() bool { return !p.Terminated && !p.Deleting }

const (
	indexByAccountNode = "ns/sa/node"
	indexByAccount     = "ns/sa"
)

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
	err := inf.AddIndexers(cache.Indexers{
		indexByAccountNode: func(obj any) ([]string, error) {
			p := podInfo(obj)
			if p == nil || p.Node == "" {
				return nil, nil
			}
			return []string{accountNodeKey(p.Namespace, p.ServiceAccount, p.Node)}, nil
		},
		indexByAccount: func(obj any) ([]string, error) {
			if p := podInfo(obj); p != nil {
				return []string{p.Namespace + "/" + p.ServiceAccount}, nil
			}
			return nil, nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("kube: pod index: %w", err)
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

// OfAccount returns the live Pods of ns/sa on any node. A miss in the
// index is confirmed against the apiserver.
func (x *PodIndex) OfAccount(ctx context.Context, ns, sa string) ([]PodInfo, error) {
	if !x.Synced() {
		return nil, ErrNotSynced
	}
	objs, err := x.informer.GetIndexer().ByIndex(indexByAccount, ns+"/"+sa)
	if err != nil {
		return nil, err
	}
	if out := live(objs, false); len(out) > 0 {
		return out, nil
	}
	if err := x.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	return x.api.OfAccount(ctx, ns, sa)
}

// OnNode returns the not-terminated Pods of ns/sa on node (a Pod being
// deleted still needs its certificate while it drains). A miss in the index
// is confirmed against the apiserver with one bounded list.
func (x *PodIndex) OnNode(ctx context.Context, ns, sa, node string) ([]PodInfo, error) {
	if !x.Synced() {
		return nil, ErrNotSynced
	}
	objs, err := x.informer.GetIndexer().ByIndex(indexByAccountNode, accountNodeKey(ns, sa, node))
	if err != nil {
		return nil, err
	}
	if out := live(objs, true); len(out) > 0 {
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
	return live(podObjects(list), true), nil
}

// OfAccount implements PodSource with one bounded list by field selector.
func (a APIPods) OfAccount(ctx context.Context, ns, sa string) ([]PodInfo, error) {
	list, err := a.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.serviceAccountName", sa).String(),
		Limit:         16,
	})
	if err != nil {
		return nil, err
	}
	return live(podObjects(list), false), nil
}

func podObjects(list *corev1.PodList) []any {
	objs := make([]any, 0, len(list.Items))
	for i := range list.Items {
		objs = append(objs, &list.Items[i])
	}
	return objs
}

// live keeps the Pods that are not terminated and, unless deleting is
// allowed, not being deleted.
func live(objs []any, deleting bool) []PodInfo {
	var out []PodInfo
	for _, o := range objs {
		if p := podInfo(o); p != nil && !p.Terminated && (deleting || !p.Deleting) {
			out = append(out, *p)
		}
	}
	return out
}

func podInfo(obj any) *PodInfo {
	switch p := obj.(type) {
	case *podRecord:
		return &PodInfo{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), ServiceAccount: p.serviceAccount, Node: p.node,
			Terminated: p.terminated, Deleting: p.DeletionTimestamp != nil}
	case *corev1.Pod:
		return &PodInfo{
			Namespace: p.Namespace, Name: p.Name, UID: string(p.UID),
			ServiceAccount: p.Spec.ServiceAccountName, Node: p.Spec.NodeName,
			Terminated: terminated(p), Deleting: p.DeletionTimestamp != nil,
		}
	}
	return nil
}

// podRecord is what the index keeps of a Pod: its identity and the three
// fields authorization reads, so that 100,000 Pods fit in a small heap.
type podRecord struct {
	metav1.ObjectMeta
	serviceAccount, node string
	terminated           bool
}

func terminated(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
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
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp},
		serviceAccount: p.Spec.ServiceAccountName,
		node:           p.Spec.NodeName,
		terminated:     terminated(p),
	}, nil
}
