package kube

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
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

// Live reports whether the Pod runs or may still run: it has not
// terminated. A Pod being deleted is live while it drains: it still
// serves, and needs its certificates, until its containers stop.
func (p *PodInfo) Live() bool { return !p.Terminated }

// PodIndex is a watch-fed cache of Pods, indexed by (namespace, service
// account, node). A miss is confirmed against the apiserver once, rate
// limited, so that informer lag never turns into a hard denial of a node
// proxy's request; a miss of a whole account (OfAccount: a workload's own
// renewal) the apiserver confirmed is remembered for a few seconds.
type PodIndex struct {
	api      APIPods
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	accounts *accountIndex
	// handler is the registration of the event handler that feeds
	// accounts (Run); the index is synced once it has had the first list.
	handler atomic.Pointer[cache.ResourceEventHandlerRegistration]
	limiter *rate.Limiter
	// nodes share limiter out among the nodes a node proxy asks for.
	nodes *nodeLookups
	// misses are the misses the apiserver confirmed (confirm).
	misses   *podMisses
	onDelete []func(PodInfo)
}

// PodIndexConfig configures a PodIndex.
type PodIndexConfig struct {
	Client kubernetes.Interface
	// LookupRate bounds apiserver confirmations of index misses (per
	// second, burst 4x); 20/s when zero. The misses of a node proxy's
	// requests for the Pods of its node get a quarter of it per node
	// (burst 1x): beyond that, that node's lookups are refused with a
	// LookupBudgetError, and other nodes' go on.
	LookupRate float64
}

// NewPodIndex assembles the index; Run starts it.
func NewPodIndex(c PodIndexConfig) (*PodIndex, error) {
	if c.LookupRate <= 0 {
		c.LookupRate = 20
	}
	f := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithTransform(slimPod))
	inf := f.Core().V1().Pods().Informer()
	return &PodIndex{api: APIPods{Client: c.Client}, factory: f, informer: inf, accounts: newAccountIndex(),
		limiter: rate.NewLimiter(rate.Limit(c.LookupRate), int(4*c.LookupRate)), nodes: newNodeLookups(c.LookupRate), misses: newPodMisses()}, nil
}

// OnDelete registers f to run when a Pod is deleted or replaced (same
// name, new UID). Call before Run.
func (x *PodIndex) OnDelete(f func(PodInfo)) {
	x.onDelete = append(x.onDelete, f)
}

// OnWatchError makes f hear each error of the informer's list and watch
// of Pods, in place of client-go's logging of them; call before Run.
func (x *PodIndex) OnWatchError(f func(error)) error {
	return x.informer.SetWatchErrorHandler(func(_ *cache.Reflector, err error) { f(err) })
}

// Run starts the informer and blocks until ctx ends.
func (x *PodIndex) Run(ctx context.Context) error {
	reg, err := x.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*podRecord); ok {
				x.accounts.add(p)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*podRecord)
			n, ok2 := newObj.(*podRecord)
			if !ok1 || !ok2 {
				return
			}
			x.accounts.remove(o)
			x.accounts.add(n)
			if !o.sameUID(n) {
				x.deleted(*o.info())
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*podRecord); ok {
				x.accounts.remove(p)
				x.deleted(*p.info())
			}
		},
	})
	if err != nil {
		return err
	}
	x.handler.Store(&reg)
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

// Synced reports whether the initial list has been loaded, into the
// informer's store and the account index both.
func (x *PodIndex) Synced() bool {
	reg := x.handler.Load()
	return reg != nil && (*reg).HasSynced() && x.informer.HasSynced()
}

// ErrNotSynced is returned before the first list completes.
var ErrNotSynced = errors.New("pod index has not synced yet")

// Pod returns a Pod by name, from the index or, on a miss, the apiserver
// (concurrent misses of one name share one lookup).
func (x *PodIndex) Pod(ctx context.Context, ns, name string) (*PodInfo, error) {
	if !x.Synced() {
		return nil, ErrNotSynced
	}
	if obj, ok, _ := x.informer.GetIndexer().GetByKey(ns + "/" + name); ok {
		return podInfo(obj), nil
	}
	out, err := x.confirm(ctx, missKey("pod", ns, name), false, "", func(ctx context.Context) ([]PodInfo, error) {
		p, err := x.api.Pod(ctx, ns, name)
		if p == nil || err != nil {
			return nil, err
		}
		return []PodInfo{*p}, nil
	})
	if err != nil || len(out) == 0 {
		return nil, err
	}
	return &out[0], nil
}

// Indexed returns the Pod ns/name if the index holds it, asking the
// apiserver nothing: a miss may be informer lag.
func (x *PodIndex) Indexed(ns, name string) (*PodInfo, bool) {
	obj, ok, _ := x.informer.GetIndexer().GetByKey(ns + "/" + name)
	if !ok {
		return nil, false
	}
	p := podInfo(obj)
	return p, p != nil
}

// OfAccount returns the live Pods (PodInfo.Live) of ns/sa on any node. A miss in the
// index is confirmed against the apiserver (confirm).
func (x *PodIndex) OfAccount(ctx context.Context, ns, sa string) ([]PodInfo, error) {
	if !x.Synced() {
		return nil, ErrNotSynced
	}
	if out := x.accounts.liveOf(ns, sa); len(out) > 0 {
		return out, nil
	}
	return x.confirm(ctx, missKey("of", ns, sa), true, "", func(ctx context.Context) ([]PodInfo, error) {
		return x.api.OfAccount(ctx, ns, sa)
	})
}

// OnNode returns the live Pods (PodInfo.Live) of ns/sa on node. A miss in the index
// is confirmed against the apiserver with one bounded list (confirm).
func (x *PodIndex) OnNode(ctx context.Context, ns, sa, node string) ([]PodInfo, error) {
	if !x.Synced() {
		return nil, ErrNotSynced
	}
	if out := x.accounts.liveOnNode(ns, sa, node); len(out) > 0 {
		return out, nil
	}
	// Not remembered: a node proxy asks for Pods its node runs, and one
	// scheduled there a moment after a miss must not wait out missTTL
	// behind a lagging informer. Paid from node's share instead.
	return x.confirm(ctx, missKey("on", ns, sa, node), false, node, func(ctx context.Context) ([]PodInfo, error) {
		return x.api.OnNode(ctx, ns, sa, node)
	})
}

// confirm answers a miss of the index with list, an apiserver list run
// once the lookup limiter allows it. Concurrent misses of one question
// (key) share one list, and, with remember, a list that found no Pod is
// remembered for missTTL (podMisses): a caller that keeps asking after
// the Pods of an account that are gone (a still-valid certificate of a
// deleted workload) then costs one list per missTTL, not one per
// request, and cannot use up the limiter that every other miss shares.
// A list for a node's proxy (node not empty) is first paid from that
// node's share (nodeLookups).
func (x *PodIndex) confirm(ctx context.Context, key string, remember bool, node string, list func(context.Context) ([]PodInfo, error)) ([]PodInfo, error) {
	if remember && x.misses.known(key) {
		return nil, nil
	}
	ch := x.misses.flight.DoChan(key, func() (any, error) {
		if remember && x.misses.known(key) {
			// A list that ended since this caller looked.
			return []PodInfo(nil), nil
		}
		// The list answers every waiter, so it must not die with the
		// first one's deadline (a short one would fail the others at
		// the limiter); it gets its own bound, and each waiter stops
		// waiting when its own request ends.
		if node != "" {
			if err := x.nodes.take(node); err != nil {
				return nil, err
			}
		}
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), confirmTimeout)
		defer cancel()
		if err := x.limiter.Wait(lctx); err != nil {
			return nil, err
		}
		out, err := list(lctx)
		if remember && err == nil && len(out) == 0 {
			x.misses.put(key)
		}
		return out, err
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return slices.Clone(res.Val.([]PodInfo)), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// confirmTimeout bounds a confirmation, which every concurrent miss of
// its question shares.
const confirmTimeout = 10 * time.Second

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
			notSucceeded, notFailed,
		).String(),
		Limit: 16,
	})
	if err != nil {
		return nil, err
	}
	return live(podObjects(list)), nil
}

// OfAccount implements PodSource with one bounded list by field selector.
func (a APIPods) OfAccount(ctx context.Context, ns, sa string) ([]PodInfo, error) {
	list, err := a.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.AndSelectors(
			fields.OneTermEqualSelector("spec.serviceAccountName", sa),
			notSucceeded, notFailed,
		).String(),
		Limit: 16,
	})
	if err != nil {
		return nil, err
	}
	return live(podObjects(list)), nil
}

// notSucceeded and notFailed leave terminated Pods out of a list: a Job's
// finished Pods stay until deleted, and would otherwise fill the bounded
// list ahead of a live one.
var (
	notSucceeded = fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded))
	notFailed    = fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed))
)

func podObjects(list *corev1.PodList) []any {
	objs := make([]any, 0, len(list.Items))
	for i := range list.Items {
		objs = append(objs, &list.Items[i])
	}
	return objs
}

// live keeps the Pods that are live (PodInfo.Live).
func live(objs []any) []PodInfo {
	var out []PodInfo
	for _, o := range objs {
		if p := podInfo(o); p != nil && p.Live() {
			out = append(out, *p)
		}
	}
	return out
}

func podInfo(obj any) *PodInfo {
	switch p := obj.(type) {
	case *podRecord:
		return p.info()
	case *corev1.Pod:
		return &PodInfo{
			Namespace: p.Namespace, Name: p.Name, UID: string(p.UID),
			ServiceAccount: p.Spec.ServiceAccountName, Node: p.Spec.NodeName,
			Terminated: terminated(p), Deleting: p.DeletionTimestamp != nil,
		}
	}
	return nil
}

func terminated(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
}
