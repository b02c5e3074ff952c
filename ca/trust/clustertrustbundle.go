package trust

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/meshca/meshca/ca/leader"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Write results of the ClusterTrustBundle publisher besides the ones it
// shares with the ConfigMap publisher.
const (
	// ResultInvalid: the apiserver refused the bundle (a root that is not
	// a CA certificate, say).
	ResultInvalid = "invalid"
	// ResultNotOwned: an object of that name exists without meshca's
	// label; it is left alone.
	ResultNotOwned = "not_owned"
)

// Discovery tells which resources an API group version serves;
// kubernetes.Interface's Discovery() is one.
type Discovery interface {
	ServerResourcesForGroupVersionWithContext(ctx context.Context, groupVersion string) (*metav1.APIResourceList, error)
}

// ClusterTrustBundleConfig configures a ClusterTrustBundlePublisher.
// Client, Bundle and TrustDomain are required.
type ClusterTrustBundleConfig struct {
	Client kubernetes.Interface
	// Discovery finds the served version of the API; nil means
	// Client.Discovery().
	Discovery Discovery
	// Bundle returns the current trust bundle and its version. Nothing
	// is written while it is empty.
	Bundle func() Bundle
	// Mark records the version published and refuses to write a bundle
	// older than it, or of another CA state (see Mark); nil writes every
	// bundle as it is. The ConfigMap publisher of the same term shares it.
	Mark *Mark
	// TrustDomain names and labels the object (see
	// ClusterTrustBundleName).
	TrustDomain spiffeid.TrustDomain
	// SignerName links the bundle to a signer (spec.signerName); writing
	// it then needs the attest verb on that signer. Empty publishes a
	// bundle linked to no signer.
	SignerName string
	// Logger receives the version chosen, or why nothing is published, and
	// one line per failed or refused write; nil discards.
	Logger *slog.Logger
	// Resync is the informer's resync period, and how long a refused
	// write waits before it is tried again; 10 minutes when zero.
	Resync time.Duration
	// Observer, if set, counts writes.
	Observer Observer
}

// ClusterTrustBundlePublisher keeps one ClusterTrustBundle equal to the
// current trust bundle, when the apiserver serves the API: created,
// updated when the bundle changes, repaired when edited or deleted. It
// writes only an object carrying LabelManagedBy=meshca. Only one replica
// should run it: see leader.Run.
type ClusterTrustBundlePublisher struct {
	cfg    ClusterTrustBundleConfig
	name   string
	labels map[string]string
	queue  workqueue.TypedRateLimitingInterface[string]

	once leader.Once

	// Set by Run before the worker starts, then read by the worker only.
	api       *ctbAPI
	store     cache.Store
	warned    bool // about a foreign object, of resourceVersion warnedFor
	warnedFor string
	stale     staleWarning
}

// errRetryAtResync is a write the apiserver refused for a reason a retry
// soon will not cure (RBAC, validation); it was logged.
var errRetryAtResync = errors.New("trust: ClusterTrustBundle refused")

// NewClusterTrustBundlePublisher assembles a publisher; Run starts it.
func NewClusterTrustBundlePublisher(c ClusterTrustBundleConfig) (*ClusterTrustBundlePublisher, error) {
	switch {
	case c.Client == nil:
		return nil, errors.New("trust: config: Client is required")
	case c.Bundle == nil:
		return nil, errors.New("trust: config: Bundle is required")
	case c.Resync < 0:
		return nil, fmt.Errorf("trust: config: Resync %v is negative", c.Resync)
	}
	name, err := ClusterTrustBundleName(c.SignerName, c.TrustDomain)
	if err != nil {
		return nil, err
	}
	if c.Discovery == nil {
		c.Discovery = c.Client.Discovery()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Resync == 0 {
		c.Resync = defaultResync
	}
	return &ClusterTrustBundlePublisher{cfg: c, name: name, stale: newStaleWarning(),
		labels: map[string]string{LabelManagedBy: ManagedBy, LabelTrustDomain: c.TrustDomain.Name()},
		queue:  leader.NewQueue(""),
	}, nil
}

// Name is the name of the ClusterTrustBundle published.
func (p *ClusterTrustBundlePublisher) Name() string { return p.name }

// Run finds the served version of the API, then keeps the object in step
// until ctx ends. When no version is served it logs so once and waits for
// ctx: a cluster without the API does not stop meshca. It returns nil
// when ctx ends, ErrStale when it steps down (the published bundle is
// newer than this replica's), and an error if called twice.
func (p *ClusterTrustBundlePublisher) Run(ctx context.Context) error {
	if err := p.once.Start("trust: ClusterTrustBundle publisher"); err != nil {
		return err
	}
	defer p.queue.ShutDown()
	// Stepping down ends the informer too (its factory's Shutdown waits
	// for that).
	ctx, stepDown := context.WithCancel(ctx)
	defer stepDown()

	api, err := p.discover(ctx)
	if err != nil {
		return nil // ctx ended
	}
	log := p.cfg.Logger.With(logName, p.name, logSigner, p.cfg.SignerName)
	if api == nil {
		log.Warn("the apiserver serves no ClusterTrustBundle API (" + strings.Join(ctbVersions(), ", ") +
			"); not publishing the trust bundle as a ClusterTrustBundle")
		<-ctx.Done()
		return nil
	}
	p.api = api
	factory := informers.NewSharedInformerFactoryWithOptions(p.cfg.Client, p.cfg.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.name).String()
		}))
	inf := api.informer(factory)
	p.store = inf.GetStore()
	enqueue := func(any) { p.queue.Add(p.name) }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("trust: ClusterTrustBundle informer: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx ended before the cache filled
	}
	log.Info("publishing the trust bundle as a ClusterTrustBundle", logVersion, api.groupVersion)
	p.queue.Add(p.name)

	done := make(chan struct{})
	go func() {
		defer close(done)
		for p.processNext(ctx, log) {
		}
	}()
	out := p.stale.watch(ctx, p.cfg.Mark, p.cfg.Bundle, p.BundleChanged)
	stepDown()
	p.queue.ShutDown()
	<-done
	return out
}

// BundleChanged queues the object for a check; call it after the bundle
// changes. It does not block.
func (p *ClusterTrustBundlePublisher) BundleChanged() { p.queue.Add(p.name) }

// discover returns the newest version serving clustertrustbundles, nil if
// none does. It retries other failures until ctx ends (then the error).
func (p *ClusterTrustBundlePublisher) discover(ctx context.Context) (*ctbAPI, error) {
	delay := time.Second
	for {
		api, err := p.servedAPI(ctx)
		if err == nil {
			return api, nil
		}
		p.cfg.Logger.Warn("cannot tell whether the apiserver serves ClusterTrustBundles; retrying",
			logDelay, delay.String(), logError, err.Error())
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Minute)
	}
}

func (p *ClusterTrustBundlePublisher) servedAPI(ctx context.Context) (*ctbAPI, error) {
	for i := range ctbAPIs {
		api := &ctbAPIs[i]
		list, err := p.cfg.Discovery.ServerResourcesForGroupVersionWithContext(ctx, api.groupVersion)
		if apierrors.IsNotFound(err) {
			continue // the group version is not served
		}
		if err != nil {
			return nil, fmt.Errorf("trust: discovery of %s: %w", api.groupVersion, err)
		}
		for _, r := range list.APIResources {
			if r.Name == ctbResource {
				return api, nil
			}
		}
	}
	return nil, nil
}

func ctbVersions() []string {
	out := make([]string, len(ctbAPIs))
	for i, a := range ctbAPIs {
		out[i] = a.groupVersion
	}
	return out
}

func (p *ClusterTrustBundlePublisher) processNext(ctx context.Context, log *slog.Logger) bool {
	key, quit := p.queue.Get()
	if quit {
		return false
	}
	defer p.queue.Done(key)
	err := p.reconcile(ctx, log)
	switch {
	case err == nil:
		p.queue.Forget(key)
	case errors.Is(err, errRetryAtResync):
		p.queue.Forget(key)
		p.queue.AddAfter(key, p.cfg.Resync)
	default:
		if ctx.Err() == nil {
			log.Warn("trust bundle ClusterTrustBundle not written; retrying", logError, err.Error())
		}
		p.queue.AddRateLimited(key)
	}
	return true
}
