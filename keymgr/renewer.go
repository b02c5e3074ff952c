package keymgr

import (
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Defaults of a Renewer.
const (
	// DefaultIntermediateTTL is the lifetime of an intermediate meshca
	// renews: a few days, so that an upstream may be away for a day or
	// more before leaves are cut short, as SPIRE's ca_ttl is a day.
	DefaultIntermediateTTL = 72 * time.Hour
	// DefaultRenewAt is the fraction of an intermediate's life left when
	// it is renewed: half, as SPIRE prepares its next CA at half.
	DefaultRenewAt = 0.5
	// DefaultRenewInterval is how often a Renewer looks.
	DefaultRenewInterval = 10 * time.Second
	// DefaultRenewTimeout bounds one call to the upstream.
	DefaultRenewTimeout = 30 * time.Second
	// DefaultRenewBackoff is the first wait after a failure; it doubles
	// with each failure in a row, up to the intermediate's life over 16
	// and never past DefaultMaxRenewBackoff, with jitter.
	DefaultRenewBackoff    = 5 * time.Second
	DefaultMaxRenewBackoff = 10 * time.Minute
)

// Renewer keeps the signing intermediates of a CA state renewed from
// their upstream, as SPIRE's server CA does: it renews the active
// authority's intermediate (and a prepared one's) when RenewAt of its
// life is left, with a key it generates, and puts the renewal in its
// place in one compare-and-swap Update, so that replicas sharing a store
// never renew one twice (a run-once Lease keeps them from calling the
// upstream twice). Every answer goes through upstream.Check first. It
// retires the intermediates it replaced once their leaves have expired,
// and prunes the oldest. A failure is retried with backoff and jitter;
// the intermediate in service keeps signing meanwhile.
//
// With the self upstream it also takes over an active authority whose
// root signs by itself, its key in the state: its first renewal puts an
// intermediate under that root.
type Renewer struct {
	Store    StateStore
	Upstream upstream.Upstream
	// Name is the upstream's (--upstream): it renews the authorities whose
	// Upstream.Type it is.
	Name        string
	TrustDomain spiffeid.TrustDomain
	// TTL is an intermediate's lifetime (DefaultIntermediateTTL when
	// zero), cut to its root's end; RenewAt the fraction of it left when
	// it is renewed (DefaultRenewAt when not in (0, 1)).
	TTL     time.Duration
	RenewAt float64
	// KeyType of the intermediates' keys.
	KeyType certs.KeyType
	// Guards' margin is added to the last leaf's expiry before a replaced
	// intermediate is retired; Keep is PruneRenewed's.
	Guards Guards
	Keep   int
	// Interval between looks, Timeout of one upstream call, Backoff and
	// MaxBackoff after failures: the package's defaults when zero.
	Interval, Timeout, Backoff, MaxBackoff time.Duration
	// Now is the clock, time.Now when nil; Jitter returns a number in
	// [0, 1), math/rand's when nil.
	Now    func() time.Time
	Jitter func() float64
	// OnRenewed hears of every renewal, OnRetired of every intermediate
	// retired, OnError of every failure (the package does not log).
	OnRenewed func(Renewal)
	OnRetired func(Step)
	OnError   func(error)

	status renewStatus
	// CRLs, when set, keeps the state's CRLs: a renewal is stored with
	// its new intermediate's first CRL (CRLKeeper.FirstCRL).
	CRLs *CRLKeeper
}

// Renewal is an intermediate renewed.
type Renewal struct {
	Upstream string
	// Old is the authority renewed, New its renewal, as stored.
	Old, New *AuthorityRecord
	// Clamped: the lifetime was cut to end with the root's.
	Clamped bool
	// Took is how long the upstream took.
	Took time.Duration
}

// errNotRenewed: another writer renewed first, or the state changed.
var errNotRenewed = errors.New("keymgr: the intermediate was renewed elsewhere")

// Tick renews what is due now, if anything, and reports the renewal;
// else it retires a replaced intermediate whose leaves have expired.
// While a failure's backoff lasts it does nothing.
func (r *Renewer) Tick(ctx context.Context) (Renewal, bool, error) {
	now := r.now()
	if r.status.waiting(now) {
		return Renewal{}, false, nil
	}
	s, _, err := r.Store.Load(ctx)
	if err != nil {
		return Renewal{}, false, err
	}
	a, err := r.due(s, now)
	switch {
	case err != nil:
		return Renewal{}, false, r.failed(now, err)
	case a == nil:
		return Renewal{}, false, r.retire(ctx, s, now)
	}
	rw, err := r.renew(ctx, s, a, now)
	if err != nil {
		if errors.Is(err, errNotRenewed) {
			return Renewal{}, false, nil
		}
		return Renewal{}, false, r.failed(now, err)
	}
	r.status.worked(now)
	return rw, true, nil
}

// renew renews a, an authority of s, at now.
func (r *Renewer) renew(ctx context.Context, s *State, a *AuthorityRecord, now time.Time) (Renewal, error) {
	ref, rootKey := a.Upstream, a.RootKey
	if !a.Renewed() {
		ref, rootKey = upstream.Ref{Type: r.Name}, a.Key // taking over a root that signs by itself
	}
	ttl, clamped := r.ttl(), false
	if left := a.Root.NotAfter.Sub(now); left < ttl {
		ttl, clamped = left, true
	}
	rec, err := r.sign(ctx, a.Root, ref, rootKey, ttl, s.Bundle(), now)
	if err != nil {
		return Renewal{}, err
	}
	rec.Generated = a.Generated
	reason := fmt.Sprintf("renewed from upstream %s: %.0f%% of the life of %.16s was left", r.Name, 100*r.renewAt(), a.ID())
	var stored *AuthorityRecord
	st, err := Update(ctx, r.Store, func(s *State) error {
		cur, err := s.View().Lookup(a.ID())
		if err != nil || cur.Phase != a.Phase {
			return errNotRenewed
		}
		if due, _ := r.due(s, now); due == nil || due.ID() != a.ID() {
			return errNotRenewed
		}
		c := *rec
		stored = &c
		if err := s.Renew(a.ID(), stored, now, reason); err != nil {
			return err
		}
		if r.CRLs != nil {
			// In the same write: the renewal signs at once, so its CRL
			// must be there to publish before its first leaf is.
			if err := r.CRLs.FirstCRL(s, stored.ID(), now); err != nil {
				return err
			}
		}
		s.PruneRenewed(now, r.Keep)
		return nil
	})
	if err != nil {
		return Renewal{}, err
	}
	old, _ := st.View().Lookup(a.ID())
	rw := Renewal{Upstream: r.Name, Old: old, New: stored, Clamped: clamped, Took: r.now().Sub(now)}
	if r.OnRenewed != nil {
		r.OnRenewed(rw)
	}
	return rw, nil
}

// sign has the upstream sign a new intermediate of a key it generates
// under root, and checks the answer: the record of the renewal, without
// its phase.
func (r *Renewer) sign(ctx context.Context, root *x509.Certificate, ref upstream.Ref, rootKey crypto.Signer, ttl time.Duration,
	bundle []*x509.Certificate, now time.Time) (*AuthorityRecord, error) {
	key, err := certs.GenerateKey(r.KeyType)
	if err != nil {
		return nil, err
	}
	subject := pkix.Name{Organization: root.Subject.Organization, CommonName: "meshca intermediate " + now.UTC().Format("2006-01-02T15:04:05Z")}
	if len(subject.Organization) == 0 {
		subject.Organization = []string{r.TrustDomain.Name()}
	}
	csr, err := upstream.NewCSR(key, subject, r.TrustDomain)
	if err != nil {
		return nil, err
	}
	req := &upstream.Request{CSR: csr, Subject: subject, TrustDomain: r.TrustDomain, Root: root, Ref: ref, RootKey: rootKey, TTL: ttl}
	sctx, cancel := context.WithTimeout(ctx, cmpOr(r.Timeout, DefaultRenewTimeout))
	defer cancel()
	resp, err := r.Upstream.SignIntermediate(sctx, req)
	if err != nil {
		return nil, err
	}
	if err := upstream.Check(req, resp, now, bundle); err != nil {
		return nil, err
	}
	return &AuthorityRecord{Root: root, Cert: resp.Cert, Chain: resp.Chain, Key: key, Upstream: ref, RootKey: rootKey}, nil
}

// NewAuthority makes the root of a new lineage in the upstream (which
// must be an upstream.RootMaker) and its first intermediate: the record
// to bootstrap a CA state with, or to prepare. It is Generated when the
// CA state keeps the root's key (self): automatic rotation then applies.
func (r *Renewer) NewAuthority(ctx context.Context, o RootOptions) (*AuthorityRecord, error) {
	rm, ok := r.Upstream.(upstream.RootMaker)
	if !ok {
		return nil, &upstream.Error{Upstream: r.Name, Kind: upstream.KindRefused, Err: errors.New("this upstream makes no roots: prepare one where it keeps them")}
	}
	if o.TTL <= 0 {
		o.TTL = DefaultRootTTL
	}
	if o.Now.IsZero() {
		o.Now = r.now()
	}
	subject := pkix.Name{Organization: []string{o.Organization}, CommonName: "meshca root " + o.Now.UTC().Format("2006-01-02T15:04:05Z")}
	root, err := rm.NewRoot(ctx, &upstream.RootRequest{KeyType: o.KeyType, Subject: subject, TTL: o.TTL, Now: o.Now})
	if err != nil {
		return nil, err
	}
	rec, err := r.sign(ctx, root.Cert, root.Ref, root.Key, min(r.ttl(), root.Cert.NotAfter.Sub(o.Now)), []*x509.Certificate{root.Cert}, o.Now)
	if err != nil {
		// The root's key is made, its first intermediate is not: the
		// key is recorded nowhere.
		made := &AuthorityRecord{Root: root.Cert, Upstream: root.Ref, madeKey: !root.Adopted && root.Key == nil}
		_, derr := r.Discard(ctx, made)
		return nil, errors.Join(err, derr)
	}
	rec.Generated = root.Key != nil
	rec.madeKey = !root.Adopted && root.Key == nil
	return rec, nil
}

// due is the authority of s to renew at now: the active one, else a
// prepared one, whose intermediate has RenewAt of its life left (or, for
// self, an active root that signs by itself). An active authority this
// upstream cannot renew is an error, as it would expire.
func (r *Renewer) due(s *State, now time.Time) (*AuthorityRecord, error) {
	a := s.Active()
	switch {
	case a == nil:
		return nil, nil
	case a.Renewed() && a.Upstream.Type != r.Name:
		return nil, &upstream.Error{Upstream: r.Name, Kind: upstream.KindRefused,
			Err: fmt.Errorf("the active authority %.16s is renewed from upstream %s, not %s: serve with --upstream %s", a.ID(), a.Upstream.Type, r.Name, a.Upstream.Type)}
	case !a.Renewed() && (r.Name != upstreamSelf || a.Key == nil || !a.SignsWithRoot()):
		return nil, &upstream.Error{Upstream: r.Name, Kind: upstream.KindRefused,
			Err: fmt.Errorf("the active authority %.16s is not renewed from an upstream, and upstream %s holds no key of its root: prepare a root there (meshca root prepare --upstream %s)", a.ID(), r.Name, r.Name)}
	case !a.Renewed() || r.dueAt(a, now):
		return a, nil
	}
	for _, p := range s.Authorities {
		if p.Phase == PhasePrepared && p.Upstream.Type == r.Name && r.dueAt(p, now) {
			return p, nil
		}
	}
	return nil, nil
}

// upstreamSelf is the self upstream's name, whose root keys the state
// keeps: it alone takes over a root that signs by itself.
const upstreamSelf = "self"

// dueAt reports whether a's intermediate is due at now: RenewAt of its
// life left (counted from when it was issued, not from its backdated
// NotBefore), unless it ends with its root already and a renewal could
// not end later.
func (r *Renewer) dueAt(a *AuthorityRecord, now time.Time) bool {
	life := a.Cert.NotAfter.Sub(a.Issued())
	at := a.Cert.NotAfter.Add(-time.Duration(r.renewAt() * float64(life)))
	return !now.Before(at) && a.Cert.NotAfter.Before(a.Root.NotAfter.Add(-time.Second))
}

// retire retires the oldest intermediate of s replaced by a renewal
// under a root another authority keeps in the bundle, once its leaves
// have expired (Guards' margin added).
func (r *Renewer) retire(ctx context.Context, s *State, now time.Time) error {
	var a *AuthorityRecord
	for _, p := range s.Authorities {
		if p.Phase == PhasePrevious && p.Renewed() && s.View().rootKeptBy(p) && !now.Before(retireSafeAt(p, r.Guards)) {
			a = p
			break
		}
	}
	if a == nil {
		return nil
	}
	step := Step{Verb: VerbRetire, ID: a.ID(), Why: "it was renewed and every leaf it issued has expired"}
	_, err := Update(ctx, r.Store, func(s *State) error {
		cur, err := s.View().Lookup(a.ID())
		if err != nil || cur.Phase != PhasePrevious {
			return errNotRenewed
		}
		if err := s.Retire(a.ID(), now, r.Guards, false, "automatic: "+step.Why); err != nil {
			return err
		}
		s.PruneRenewed(now, r.Keep)
		return nil
	})
	switch {
	case errors.Is(err, errNotRenewed):
		return nil
	case err != nil:
		return err
	}
	if r.OnRetired != nil {
		r.OnRetired(step)
	}
	return nil
}

// Run ticks every Interval until ctx ends, then returns nil.
func (r *Renewer) Run(ctx context.Context) error {
	r.tick(ctx)
	every(ctx, r.Interval, DefaultRenewInterval, nil, func() { r.tick(ctx) })
	return nil
}

func (r *Renewer) tick(ctx context.Context) {
	if _, _, err := r.Tick(ctx); err != nil && ctx.Err() == nil && r.OnError != nil {
		r.OnError(err)
	}
}

func (r *Renewer) ttl() time.Duration { return cmpOr(r.TTL, DefaultIntermediateTTL) }

func (r *Renewer) renewAt() float64 {
	if r.RenewAt <= 0 || r.RenewAt >= 1 {
		return DefaultRenewAt
	}
	return r.RenewAt
}

func (r *Renewer) now() time.Time {
	if r.Now == nil {
		return time.Now()
	}
	return r.Now()
}

// cmpOr is d, or def when d is not positive.
func cmpOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
