package istiodcert

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Defaults of Config.
const (
	DefaultTTL = 24 * time.Hour
	// DefaultResync is how often the keeper looks without being told: the
	// Secret's informer and the CA state's changes tell it sooner.
	DefaultResync = 30 * time.Second
	// maxBackoff bounds the wait after a failed write.
	maxBackoff = time.Minute
)

// Config assembles a Keeper. Client, Namespace, Name, Owner, Names,
// Issuer, Bundle are required.
type Config struct {
	Client          kubernetes.Interface
	Namespace, Name string
	// Owner is the keeper's mark, AnnotationOwner's value: it writes only
	// a Secret it creates, one marked Owner, or one handed over
	// (AnnotationAdopt).
	Owner string
	// Names are the DNS names of istiod's certificate.
	Names []string
	// TTL is its lifetime; DefaultTTL when zero. It is renewed at two
	// thirds of it.
	TTL    time.Duration
	Issuer Issuer
	// Bundle returns the trust bundle in service.
	Bundle func() []*x509.Certificate
	// Signing returns the certificate that signs for the CA now, or nil
	// when it is not known.
	Signing func() *x509.Certificate
	// Deployment, when set, is istiod's Deployment in Namespace, which the
	// keeper restarts when the roots grow: istiod reads the roots it
	// verifies clients with only when it starts.
	Deployment string
	// Observe, when set, hears of every write (its reason) and failure.
	Observe Observer
	Resync  time.Duration
	Logger  *slog.Logger
	Now     func() time.Time
}

// Observer hears what a Keeper does; metrics implement it.
type Observer interface {
	// Written: the Secret was written for reason, its leaf expiring at
	// notAfter.
	Written(reason string, notAfter time.Time)
	// Failed: writing it for reason failed.
	Failed(reason string)
	// Restarted: istiod's Deployment was restarted to load new roots.
	Restarted()
	// Refused: the Secret is another owner's (a RefusalReasons), or ""
	// when the keeper may write it (again), or no longer looks.
	Refused(reason string)
}

// Keeper keeps the Secret. Only one replica should run it: see
// leader.Run.
type Keeper struct {
	c     Config
	poke  chan struct{}
	fails int

	mu      sync.Mutex
	refusal *RefusedError // the Secret is another owner's; nil: none
}

// New returns a Keeper; it starts nothing.
func New(c Config) (*Keeper, error) {
	switch {
	case c.Client == nil:
		return nil, errors.New("istiodcert: a Kubernetes client is required")
	case c.Namespace == "" || c.Name == "":
		return nil, errors.New("istiodcert: the Secret's namespace and name are required")
	case c.Owner == "":
		return nil, errors.New("istiodcert: the keeper's owner mark is required")
	case len(c.Names) == 0:
		return nil, errors.New("istiodcert: at least one DNS name is required")
	case c.Issuer == nil || c.Bundle == nil:
		return nil, errors.New("istiodcert: an issuer and the trust bundle are required")
	}
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.Resync <= 0 {
		c.Resync = DefaultResync
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Keeper{c: c, poke: make(chan struct{}, 1)}, nil
}

// Secret is namespace/name.
func (k *Keeper) Secret() string { return k.c.Namespace + "/" + k.c.Name }

// Changed tells the keeper the CA state in service changed: it looks at
// once. It never blocks.
func (k *Keeper) Changed() {
	select {
	case k.poke <- struct{}{}:
	default:
	}
}

// Run watches the Secret and keeps it until ctx ends, then returns nil.
func (k *Keeper) Run(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(k.c.Client, k.c.Resync, informers.WithNamespace(k.c.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", k.c.Name).String()
		}))
	inf := f.Core().V1().Secrets()
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.Changed() },
		UpdateFunc: func(any, any) { k.Changed() },
		DeleteFunc: func(any) { k.Changed() },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	defer k.forget()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return nil
	}
	k.probeRestartGuard(ctx)
	lister := inf.Lister().Secrets(k.c.Namespace)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-k.poke:
		case <-timer.C:
		}
		cur, err := lister.Get(k.c.Name)
		if apierrors.IsNotFound(err) {
			cur, err = nil, nil
		}
		wait := k.c.Resync
		if err == nil {
			wait = k.keep(ctx, cur)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// keep writes the Secret when it must and returns how long until the
// next look.
func (k *Keeper) keep(ctx context.Context, cur *corev1.Secret) time.Duration {
	now := k.now()
	held, adopt := &Held{}, false
	if cur != nil {
		var refused *RefusedError
		if adopt, refused = judge(cur, k.c.Owner); refused != nil {
			k.refuse(ctx, refused)
			return k.c.Resync
		}
		held = Parse(cur)
	}
	k.refuse(ctx, nil)
	reason := decide(held, now)
	switch {
	case adopt && cur.Annotations[AnnotationAdopt] == "true":
		reason = ReasonAdopted
	case adopt && reason == "":
		reason = ReasonOwnerMark
	}
	if reason == "" {
		k.fails = 0
		return min(k.c.Resync, max(RenewAt(held.Leaf()).Sub(now.Time), time.Second), k.restartIstiod(ctx, now.Bundle))
	}
	leaf, err := k.write(ctx, cur, now, reason, adopt)
	if err != nil {
		if k.c.Observe != nil {
			k.c.Observe.Failed(reason)
		}
		k.fails++
		wait := min(time.Second<<min(k.fails, 6), maxBackoff)
		level := slog.LevelWarn
		if apierrors.IsConflict(err) {
			// Another writer came between: look again at once.
			level, wait = slog.LevelInfo, 0
		}
		k.c.Logger.Log(ctx, level, "istiod certificate not written", "secret", k.Secret(), "reason", reason, "retry_in", wait.String(), "error", err)
		return wait
	}
	k.fails = 0
	if k.c.Observe != nil {
		k.c.Observe.Written(reason, leaf.NotAfter)
	}
	k.c.Logger.Info("istiod certificate written", "secret", k.Secret(), "reason", reason, "serial", leaf.SerialNumber.Text(16),
		"not_after", leaf.NotAfter, "renew_at", RenewAt(leaf), "roots", len(now.Bundle))
	return min(k.c.Resync, max(RenewAt(leaf).Sub(k.c.Now()), time.Second), k.restartIstiod(ctx, now.Bundle))
}

// restartIstiod restarts istiod's Deployment, when there is one and its
// Pods started without a root of bundle, and returns how soon to look
// again: at once when it waits for what istiod will read to catch up, the
// resync period otherwise.
func (k *Keeper) restartIstiod(ctx context.Context, bundle []*x509.Certificate) time.Duration {
	if k.c.Deployment == "" {
		return k.c.Resync
	}
	restarted, waiting, err := k.restart(ctx, bundle)
	switch {
	case err != nil:
		k.c.Logger.Warn("istiod not restarted to load its new roots", "deployment", k.c.Namespace+"/"+k.c.Deployment, "error", err)
		return min(k.c.Resync, 5*time.Second)
	case waiting != "":
		return time.Second
	case restarted:
		if k.c.Observe != nil {
			k.c.Observe.Restarted()
		}
		k.c.Logger.Info("istiod restarted to load its new roots: it reads the roots it verifies clients with only when it starts",
			"deployment", k.c.Namespace+"/"+k.c.Deployment, "roots", len(bundle))
	}
	return k.c.Resync
}

func (k *Keeper) now() Now {
	n := Now{Time: k.c.Now(), Bundle: k.c.Bundle(), Names: k.c.Names, Deployment: k.c.Deployment}
	if k.c.Signing != nil {
		if c := k.c.Signing(); c != nil {
			n.Signing = keymgr.Fingerprint(c)
		}
	}
	return n
}

// write issues a certificate for a fresh key and writes it over cur (nil:
// creates the Secret), compare-and-swap on cur's resourceVersion. The key
// lives only in this process and in the Secret.
func (k *Keeper) write(ctx context.Context, cur *corev1.Secret, now Now, reason string, adopt bool) (*x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("istiodcert: generate key: %w", err)
	}
	req, err := csr.BuildDNS(key, k.c.Names)
	if err != nil {
		return nil, err
	}
	out, err := k.c.Issuer.IssueDNS(ctx, &IssueRequest{Secret: k.Secret(), CSR: req, DNSNames: k.c.Names, TTL: k.c.TTL})
	if err != nil {
		return nil, err
	}
	s, err := secretFor(cur, k.c.Namespace, k.c.Name, key, out, now)
	if err != nil {
		return nil, err
	}
	markSecret(s, k.c.Owner, adopt || cur == nil)
	if cur == nil {
		_, err = k.c.Client.CoreV1().Secrets(k.c.Namespace).Create(ctx, s, metav1.CreateOptions{})
	} else {
		_, err = k.c.Client.CoreV1().Secrets(k.c.Namespace).Update(ctx, s, metav1.UpdateOptions{})
	}
	if err != nil {
		return nil, err
	}
	return out.Leaf, nil
}

// secretFor is cur (or a new kubernetes.io/tls Secret) holding key and
// out: exactly the three keys, whatever else cur held (a Secret the
// keeper may write: judge), the fingerprint of the certificate that
// signed for the CA at issuance, and the Deployment restarted for new
// roots. markSecret marks it.
func secretFor(cur *corev1.Secret, namespace, name string, key crypto.Signer, out *Issued, now Now) (*corev1.Secret, error) {
	keyPEM, err := pemutil.EncodePrivateKey(key)
	if err != nil {
		return nil, err
	}
	var s *corev1.Secret
	if cur == nil {
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Type: corev1.SecretTypeTLS}
	} else {
		s = cur.DeepCopy()
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	for k, v := range map[string]string{AnnotationIssuedUnder: now.Signing, AnnotationDeployment: now.Deployment} {
		delete(s.Annotations, k)
		if v != "" {
			s.Annotations[k] = v
		}
	}
	chain := append([]*x509.Certificate{out.Leaf}, out.Intermediates...)
	s.Data = map[string][]byte{
		KeyCert:  pemutil.EncodeCertificates(chain...),
		KeyKey:   keyPEM,
		KeyRoots: pemutil.EncodeCertificates(out.Roots...),
	}
	return s, nil
}
