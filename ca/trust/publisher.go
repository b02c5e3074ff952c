// Package trust publishes meshca's trust bundle where workloads read it:
// the ConfigMap istio-ca-root-cert in every namespace, as Istio's own
// namespace controller does, so istio-agent and ztunnel find their roots
// in the place they already look (Publisher), and a ClusterTrustBundle,
// which Pods mount by signer name (ClusterTrustBundlePublisher); and the
// CAs' revocation lists, as the ConfigMap istio-ca-crl in the same
// namespaces (a Publisher of CRLDocument). Only one replica should write:
// run the publishers under leader.Run.
package trust

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/meshca/meshca/ca/leader"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// The names Istio's workloads read; they are part of the wire contract.
const (
	// ConfigMapName is the ConfigMap published in every namespace.
	ConfigMapName = "istio-ca-root-cert"
	// DataKey is the ConfigMap key holding the PEM bundle.
	DataKey = "root-cert.pem"
	// CRLConfigMapName is the ConfigMap of the CAs' revocation lists,
	// which istio-agent and ztunnel read beside the roots.
	CRLConfigMapName = "istio-ca-crl"
	// CRLDataKey is its key: one or more PEM CRLs, concatenated.
	CRLDataKey = "ca-crl.pem"
	// LabelKey and LabelValue mark the ConfigMap as Istio configuration.
	LabelKey   = "istio.io/config"
	LabelValue = "true"
)

// Document is what a Publisher keeps in every namespace: a ConfigMap's
// name and the one data key it holds.
type Document struct {
	Name, Key string
}

// The documents Istio's workloads read.
var (
	// RootCertDocument is the trust bundle, istio-ca-root-cert.
	RootCertDocument = Document{Name: ConfigMapName, Key: DataKey}
	// CRLDocument is the revocation lists, istio-ca-crl.
	CRLDocument = Document{Name: CRLConfigMapName, Key: CRLDataKey}
)

// alwaysSkipped are namespaces no workload of the mesh runs in. Not
// kube-system: ztunnel runs there in many installs (GKE's among them) and
// does not start without the ConfigMap, so Istio's namespace controller
// publishes there too; --trust-skip-namespaces can leave it out.
var alwaysSkipped = []string{"kube-public", "kube-node-lease"}

const (
	defaultResync  = 10 * time.Minute
	defaultWorkers = 4
)

// Observer counts the Publisher's writes by result (one of the Result*
// constants). trustprom.Counter is the Prometheus one.
type Observer interface {
	ObserveWrite(result string)
}

// Write results passed to Observer.
const (
	ResultCreated   = "created"
	ResultUpdated   = "updated"
	ResultConflict  = "conflict"
	ResultForbidden = "forbidden"
	ResultError     = "error"
)

// Config configures a Publisher. Client and Bundle are required.
type Config struct {
	Client kubernetes.Interface
	// Document is the ConfigMap written; RootCertDocument when zero.
	Document Document
	// Bundle returns the current content of the document (the trust
	// bundle; the CRLs) and its version. Nothing is written while it is
	// empty: ConfigMaps already written stay as they are.
	Bundle func() Bundle
	// Published, if set, hears of the content each namespace holds once
	// reconciled (written, or found current), and of nil when Run
	// returns: this replica then publishes nothing.
	Published func(pem []byte)
	// Mark records the version published and refuses to write a bundle
	// older than it, or of another CA state (see Mark); nil writes every
	// bundle as it is (one replica alone, or tests).
	Mark *Mark
	// Selector limits publishing to namespaces whose labels match; nil
	// means every namespace.
	Selector labels.Selector
	// Skip names namespaces never written to, in addition to kube-public
	// and kube-node-lease (kube-system is written to unless named here).
	Skip []string
	// Logger receives one line per failed or refused write; nil discards.
	Logger *slog.Logger
	// Resync is the informers' resync period, after which every namespace
	// is checked again; 10 minutes when zero.
	Resync time.Duration
	// Workers is the number of namespaces reconciled in parallel; 4 when
	// zero.
	Workers int
	// Observer, if set, counts writes.
	Observer Observer
}

// Publisher keeps the ConfigMap of its Document (istio-ca-root-cert by
// default) in every selected namespace equal to the current bundle:
// created in new namespaces, updated when the bundle changes, repaired
// when edited or deleted.
type Publisher struct {
	cfg        Config
	skip       map[string]bool
	nsFactory  informers.SharedInformerFactory
	cmFactory  informers.SharedInformerFactory
	nsInformer cache.SharedIndexInformer
	cmInformer cache.SharedIndexInformer
	namespaces listerscorev1.NamespaceLister
	configMaps listerscorev1.ConfigMapLister
	queue      workqueue.TypedRateLimitingInterface[string]

	once  leader.Once
	stale staleWarning
}

// NewPublisher assembles a Publisher; Run starts it.
func NewPublisher(c Config) (*Publisher, error) {
	switch {
	case c.Client == nil:
		return nil, errors.New("trust: config: Client is required")
	case c.Bundle == nil:
		return nil, errors.New("trust: config: Bundle is required")
	case c.Resync < 0:
		return nil, fmt.Errorf("trust: config: Resync %v is negative", c.Resync)
	case c.Workers < 0:
		return nil, fmt.Errorf("trust: config: Workers %d is negative", c.Workers)
	case (c.Document.Name == "") != (c.Document.Key == ""):
		return nil, fmt.Errorf("trust: config: Document %+v needs both a name and a key", c.Document)
	}
	if c.Document.Name == "" {
		c.Document = RootCertDocument
	}
	if c.Selector == nil {
		c.Selector = labels.Everything()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Resync == 0 {
		c.Resync = defaultResync
	}
	if c.Workers == 0 {
		c.Workers = defaultWorkers
	}
	p := &Publisher{cfg: c, skip: map[string]bool{}, stale: newStaleWarning()}
	for _, ns := range append(append([]string(nil), alwaysSkipped...), c.Skip...) {
		p.skip[ns] = true
	}
	p.nsFactory = informers.NewSharedInformerFactory(c.Client, c.Resync)
	// The ConfigMaps are cached as summaries (summarize): tenants write
	// them too, and may pad them.
	p.cmFactory = informers.NewSharedInformerFactoryWithOptions(c.Client, c.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.Document.Name).String()
		}), informers.WithTransform(c.Document.summarize))
	p.nsInformer = p.nsFactory.Core().V1().Namespaces().Informer()
	p.cmInformer = p.cmFactory.Core().V1().ConfigMaps().Informer()
	p.namespaces = p.nsFactory.Core().V1().Namespaces().Lister()
	p.configMaps = p.cmFactory.Core().V1().ConfigMaps().Lister()
	p.queue = leader.NewQueue("")
	return p, nil
}

// Run starts the informers and the workers and blocks until ctx ends. It
// returns nil when ctx ends, ErrStale when it steps down (its Mark
// refuses this replica's bundle), and an error if called twice.
func (p *Publisher) Run(ctx context.Context) error {
	if err := p.once.Start("trust: publisher"); err != nil {
		return err
	}
	defer p.queue.ShutDown()
	defer p.published(nil)
	// Stepping down ends the informers too (their factories' Shutdown
	// waits for that).
	ctx, stepDown := context.WithCancel(ctx)
	defer stepDown()

	nsHandler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.enqueueName(obj) },
		UpdateFunc: func(_, obj any) { p.enqueueName(obj) },
	}
	cmHandler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.enqueueNamespaceOf(obj) },
		UpdateFunc: func(_, obj any) { p.enqueueNamespaceOf(obj) },
		DeleteFunc: func(obj any) { p.enqueueNamespaceOf(obj) },
	}
	if _, err := p.nsInformer.AddEventHandler(nsHandler); err != nil {
		return fmt.Errorf("trust: namespace informer: %w", err)
	}
	if _, err := p.cmInformer.AddEventHandler(cmHandler); err != nil {
		return fmt.Errorf("trust: configmap informer: %w", err)
	}
	p.nsFactory.Start(ctx.Done())
	p.cmFactory.Start(ctx.Done())
	defer p.nsFactory.Shutdown()
	defer p.cmFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), p.nsInformer.HasSynced, p.cmInformer.HasSynced) {
		return nil // ctx ended before the caches filled
	}

	var wg sync.WaitGroup
	for range p.cfg.Workers {
		wg.Go(func() {
			for p.processNext(ctx) {
			}
		})
	}
	err := p.stale.watch(ctx, p.cfg.Mark, p.cfg.Bundle, p.BundleChanged)
	stepDown()
	p.queue.ShutDown()
	wg.Wait()
	return err
}

// BundleChanged queues every known namespace; call it after the bundle
// changes. It does not block.
func (p *Publisher) BundleChanged() {
	nss, err := p.namespaces.List(labels.Everything())
	if err != nil {
		return // the cache lister never fails
	}
	for _, ns := range nss {
		p.queue.Add(ns.Name)
	}
}

func (p *Publisher) enqueueName(obj any) {
	if ns, ok := obj.(*corev1.Namespace); ok {
		p.queue.Add(ns.Name)
	}
}

func (p *Publisher) enqueueNamespaceOf(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if cm, ok := obj.(*corev1.ConfigMap); ok {
		p.queue.Add(cm.Namespace)
	}
}

func (p *Publisher) processNext(ctx context.Context) bool {
	ns, quit := p.queue.Get()
	if quit {
		return false
	}
	defer p.queue.Done(ns)
	if err := p.reconcile(ctx, ns); err != nil {
		if ctx.Err() == nil {
			p.cfg.Logger.Warn("published ConfigMap not written; retrying",
				logName, p.cfg.Document.Name, logNamespace, ns, logError, err.Error())
		}
		p.queue.AddRateLimited(ns)
		return true
	}
	p.queue.Forget(ns)
	return true
}
