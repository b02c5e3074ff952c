// Package podcert signs Kubernetes PodCertificateRequests for one signer
// name: the kubelet asks for a Pod's certificate, and meshca answers with
// the Pod's SPIFFE SVID, spiffe://<trust domain>/ns/<namespace>/sa/<service
// account>, through the same key policy, signer, verification, audit and
// metrics as the gRPC path (the Issuer, which ca implements). Only one
// replica should run a Controller: see leader.Run.
package podcert

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/meshca/meshca/ca/leader"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Issuer signs a Pod's certificate and records every decision; ca's
// PodIssuer is the one implementation, so that a Pod certificate passes
// the same key policy, backend, chain verification, audit sink and
// metrics as a CreateCertificate.
type Issuer interface {
	// IssuePod signs req. Its errors are typed: *csr.Error for a key the
	// policy refuses, *signer.Error for a backend failure, *Busy for a
	// request over a budget of the CA, *Refusal for a request the CA
	// refuses as such (a blocked node: NodeBlocked).
	IssuePod(ctx context.Context, req *IssueRequest) (*Issued, error)
	// RecordPod audits and counts one decision.
	RecordPod(ctx context.Context, d *Decision)
}

// IssueRequest is what IssuePod signs.
type IssueRequest struct {
	// StubPKCS10 is spec.stubPKCS10Request (DER): only its key is used.
	StubPKCS10 []byte
	ID         spiffeid.ID
	// Lifetime is the certificate's validity, NotAfter less NotBefore,
	// exactly (signer.Request.Lifetime): within [MinLifetime,
	// maxExpirationSeconds], which the backend's backdate must not push
	// it out of.
	Lifetime time.Duration
	// Node is spec.nodeName: the kubelet that asked, as the apiserver's
	// Node authorizer and NodeRestriction admission hold it to its own
	// Pods. The CA's budgets are kept per node.
	Node string
}

// Issued is a verified certificate.
type Issued struct {
	Leaf *x509.Certificate
	// ChainPEM is the leaf then its intermediates, without any root.
	ChainPEM string
	// Issuer is the ID (keymgr.Fingerprint) of the CA certificate that
	// signed Leaf, when known: audited, for meshca revoke.
	Issuer string
}

// Decision is one answer given to a PodCertificateRequest, for the audit
// log and the metrics.
type Decision struct {
	Request *certv1.PodCertificateRequest
	// Identity is the SPIFFE ID the Pod was (or would have been) issued.
	Identity spiffeid.ID
	// Condition is the condition type written: Issued, Denied or Failed.
	Condition string
	// Reason is a stable snake_case word ("ok", "pod_gone", ...), Detail
	// the full story.
	Reason, Detail string
	// Leaf is the certificate signed for the request, if any: the one
	// Issued, or one signed and then refused (LifetimeOutOfRange, a chain
	// that failed verification), which the status never carries but whose
	// serial is audited.
	Leaf    *x509.Certificate
	Latency time.Duration
	// Issuer is the Issued one's (Issued.Issuer).
	Issuer string
}

// Defaults of Config.
const (
	DefaultMaxTTL  = 24 * time.Hour
	DefaultWorkers = 4
	defaultResync  = 10 * time.Minute
	// MinLifetime and MaxLifetime are the API's bounds on a certificate's
	// lifetime (NotAfter - NotBefore).
	MinLifetime = time.Hour
	// maxFailedAttempts bounds the signing failures of a request, other
	// than an unavailable backend's, counted per request; then it is
	// Failed.
	maxFailedAttempts = 5
)

// Config configures a Controller. Client, SignerName, TrustDomain and
// Issuer are required.
type Config struct {
	Client      kubernetes.Interface
	SignerName  string
	TrustDomain spiffeid.TrustDomain
	Issuer      Issuer
	// Namespaces selects, by their labels, the namespaces whose Pods may
	// get certificates; nil allows all.
	Namespaces labels.Selector
	// MaxTTL caps a certificate's lifetime below the request's
	// maxExpirationSeconds; DefaultMaxTTL when zero.
	MaxTTL time.Duration
	// Workers is how many requests are answered at once.
	Workers int
	// Resync is the informer's resync period; 10 minutes when zero.
	Resync time.Duration
	Logger *slog.Logger
	Now    func() time.Time
	// Jitter returns a number in [0, 1) that spreads beginRefreshAt;
	// math/rand when nil.
	Jitter func() float64
}

// The delays of a request over a budget of the CA (IssuePod's *Busy), at
// least its hint: busyBaseDelay, doubled with each refusal in a row up to
// busyMaxDelay, plus up to a fifth at random.
const (
	busyBaseDelay = 250 * time.Millisecond
	busyMaxDelay  = 2 * time.Minute
)

// Controller answers the PodCertificateRequests of one signer name.
type Controller struct {
	c     Config
	log   *slog.Logger
	queue workqueue.TypedRateLimitingInterface[string]
	// busy spaces the retries of a request over a budget of the CA.
	busy workqueue.TypedRateLimiter[string]

	once   leader.Once
	lister cache.Indexer

	// held is what the controller holds of the requests it has tried to
	// sign or answered without delivering the answer yet, by key
	// (deliver.go).
	heldMu sync.Mutex
	held   map[string]*pending
}

// New assembles a Controller; Run starts it.
func New(c Config) (*Controller, error) {
	switch {
	case c.Client == nil:
		return nil, errors.New("podcert: config: Client is required")
	case c.SignerName == "":
		return nil, errors.New("podcert: config: SignerName is required")
	case c.TrustDomain.IsZero():
		return nil, errors.New("podcert: config: TrustDomain is required")
	case c.Issuer == nil:
		return nil, errors.New("podcert: config: Issuer is required")
	case c.MaxTTL < 0 || c.Workers < 0 || c.Resync < 0:
		return nil, errors.New("podcert: config: MaxTTL, Workers and Resync must not be negative")
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = DefaultMaxTTL
	}
	if c.MaxTTL < MinLifetime {
		return nil, fmt.Errorf("podcert: config: MaxTTL %v is less than the API's minimum lifetime %v", c.MaxTTL, MinLifetime)
	}
	if c.Namespaces == nil {
		c.Namespaces = labels.Everything()
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Resync == 0 {
		c.Resync = defaultResync
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Jitter == nil {
		c.Jitter = rand.Float64
	}
	return &Controller{c: c, log: c.Logger.With(logSigner, c.SignerName), held: map[string]*pending{},
		busy:  workqueue.NewTypedItemExponentialFailureRateLimiter[string](busyBaseDelay, busyMaxDelay),
		queue: leader.NewQueue("podcert")}, nil
}

// Run watches the requests of the signer name and answers each until ctx
// ends; it returns nil then, and an error if called twice.
func (ctl *Controller) Run(ctx context.Context) error {
	if err := ctl.once.Start("podcert: controller"); err != nil {
		return err
	}
	defer ctl.queue.ShutDown()

	factory := informers.NewSharedInformerFactoryWithOptions(ctl.c.Client, ctl.c.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", ctl.c.SignerName).String()
		}))
	inf := factory.Certificates().V1().PodCertificateRequests().Informer()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			ctl.queue.Add(key)
		}
	}
	// A deleted request whose answer is held is synced once more, which
	// audits a certificate that was never delivered and forgets it.
	gone := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil && ctl.holds(key) {
			ctl.queue.Add(key)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: gone,
	}); err != nil {
		return fmt.Errorf("podcert: informer: %w", err)
	}
	ctl.lister = inf.GetIndexer()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx ended before the cache filled
	}
	ctl.log.Info("signing PodCertificateRequests")
	// A request being answered when ctx ends is answered to the end, its
	// certificate delivered, within ShutdownGrace: the Lease is released
	// (leader.Run) only once Run returns, so no successor signs it
	// too. No other request is started.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var wg sync.WaitGroup
	for range ctl.c.Workers {
		wg.Go(func() {
			for ctl.processNext(ctx, work) {
			}
		})
	}
	<-ctx.Done()
	ctl.queue.ShutDown()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(ShutdownGrace):
		stopWork()
		<-done
	}
	return nil
}

// ShutdownGrace bounds how long Run, once its context has ended, lets
// the requests being answered finish.
const ShutdownGrace = 10 * time.Second

// processNext answers the next request with the context work, unless ctx
// has ended.
func (ctl *Controller) processNext(ctx, work context.Context) bool {
	key, quit := ctl.queue.Get()
	if quit {
		return false
	}
	defer ctl.queue.Done(key)
	if ctx.Err() != nil {
		return false
	}
	err := ctl.sync(work, key)
	var busy *Busy
	switch {
	case err == nil:
		ctl.queue.Forget(key)
		ctl.busy.Forget(key)
	case ctx.Err() != nil:
	case errors.As(err, &busy):
		// Not a failure, and not worth a warning each time (the CA counts
		// it in meshca_rate_limited_total). Not before the CA's hint, and
		// later with each refusal: each retry reads the request, its Pod,
		// service account, node and namespace again, and a node whose
		// kubelet creates requests in a loop must not keep the workers
		// and the apiserver busy.
		delay := max(busy.RetryAfter, ctl.busy.When(key))
		delay += time.Duration(ctl.c.Jitter() * float64(delay) / 5)
		ctl.log.Debug("PodCertificateRequest over a budget of the CA; queued again", logRequest, key, logReason, busy.Reason,
			logRetryAfter, delay.String())
		ctl.queue.AddAfter(key, delay)
	default:
		ctl.log.Warn("PodCertificateRequest not answered yet; retrying", logRequest, key, logError, err.Error())
		ctl.queue.AddRateLimited(key)
	}
	return true
}

// Log field names.
const (
	logSigner     = "signer_name"
	logRequest    = "request"
	logCondition  = "condition"
	logReason     = "reason"
	logRetryAfter = "retry_after"
	logError      = "error"
)
