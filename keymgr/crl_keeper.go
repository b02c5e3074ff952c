package keymgr

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
)

// Defaults of a CRLKeeper.
const (
	// DefaultCRLValidity is how long a CRL is valid (nextUpdate after
	// thisUpdate's now): a verifier holding an expired CRL keeps using
	// it (ztunnel) or refuses every chain through its CA (Envoy,
	// openssl), either way a day of outage of the keeper is what it
	// tolerates.
	DefaultCRLValidity = 24 * time.Hour
	// DefaultCRLRefreshAt is the fraction of a CRL's validity after which
	// it is reissued with no change: half, so that a keeper that fails
	// has the other half to recover.
	DefaultCRLRefreshAt = 0.5
	// DefaultCRLInterval is how often a CRLKeeper looks.
	DefaultCRLInterval = 10 * time.Second
	// CRLBackdate is how far before now a CRL's thisUpdate is, for
	// verifiers whose clock is behind.
	CRLBackdate = certs.Backdate
)

// CRLKeeper keeps a CRL in the CA state for every CA that needs one
// (View.CRLIssuers): it issues one for a CA that has none, reissues it
// when the revocations it lists changed or RefreshAt of its validity has
// passed, with a CRL number that only grows, and drops the revocations
// that expired and the CRLs of CAs gone. It signs with the key the state
// holds (an authority's, or the self upstream's root key) or has
// Upstream sign (a root in a PKCS#11 token, in Vault Transit). Every
// change is one compare-and-swap Update: replicas sharing a store never
// store two CRLs with one number; run it on the leader only, as the
// Renewer. The package does not log.
type CRLKeeper struct {
	Store StateStore
	// Upstream signs the CRLs of the CAs whose key it keeps, those whose
	// Upstream.Type is UpstreamName; nil: none.
	Upstream     upstream.CRLSigner
	UpstreamName string
	// Source, when the upstream keeps the CRLs of its CAs itself (Vault
	// PKI), makes the CRLs of the CAs whose key it keeps in place of
	// Upstream: their CRL is the upstream's, and a revocation by such a
	// CA is made there first (crl_source.go).
	Source upstream.CRLSource
	// Validity of a CRL (DefaultCRLValidity when zero); RefreshAt the
	// fraction of it after which it is reissued (DefaultCRLRefreshAt
	// when not in (0, 1)).
	Validity  time.Duration
	RefreshAt float64
	// Interval between looks, Timeout of one upstream call: the
	// package's defaults when zero.
	Interval, Timeout time.Duration
	// Now is the clock, time.Now when nil.
	Now func() time.Time
	// OnIssued hears of every CRL stored, OnFailed of every CA whose CRL
	// could not be signed at a look; OnError of every failure that
	// differs from the one before (Run).
	OnIssued func(CRLIssued)
	OnFailed func(*CRLError)
	OnError  func(error)

	pokeOnce sync.Once
	pokes    chan struct{}
}

// Poke asks Run for a look now rather than at its next Interval: the CA
// state changed (`meshca revoke` stored a revocation), and its CRLs may
// be due. It never blocks; pokes while a look is pending make one.
func (k *CRLKeeper) Poke() {
	select {
	case k.pokeChan() <- struct{}{}:
	default:
	}
}

func (k *CRLKeeper) pokeChan() chan struct{} {
	k.pokeOnce.Do(func() { k.pokes = make(chan struct{}, 1) })
	return k.pokes
}

// CRLIssued is a CRL stored.
type CRLIssued struct {
	Issuer  string
	Subject string
	Number  *big.Int
	// Entries is how many certificates it lists.
	Entries    int
	NextUpdate time.Time
	// Why it was issued: CRLDue's reason.
	Why string
}

// CRLError is the failure to issue one CA's CRL.
type CRLError struct {
	Issuer  string
	Subject string
	Err     error
}

func (e *CRLError) Error() string {
	return fmt.Sprintf("keymgr: CRL of %.16s (%s): %v", e.Issuer, e.Subject, e.Err)
}

func (e *CRLError) Unwrap() error { return e.Err }

// errCRLNothing: the Update found nothing to store.
var errCRLNothing = errors.New("keymgr: no CRL to store")

// signedCRL is a CRL signed for the state as loaded, and why.
type signedCRL struct {
	is  CRLIssuer
	rec CRLRecord
	why string
}

// Tick issues the CRLs due now and stores them with the pruning in one
// Update. It returns what it stored and the failures (a *CRLError each,
// joined): one CA's failure does not hold the others back.
func (k *CRLKeeper) Tick(ctx context.Context) ([]CRLIssued, error) {
	now := k.now()
	s, _, err := k.Store.Load(ctx)
	if err != nil {
		return nil, err
	}
	var signed []signedCRL
	var errs []error
	v := s.View()
	for _, is := range v.CRLIssuers() {
		why := k.due(v, is, now)
		if why == "" {
			continue
		}
		rec, err := k.sign(ctx, v, is, now)
		if err != nil {
			ce := &CRLError{Issuer: is.ID, Subject: is.Cert.Subject.String(), Err: err}
			if k.OnFailed != nil {
				k.OnFailed(ce)
			}
			errs = append(errs, ce)
			continue
		}
		signed = append(signed, signedCRL{is: is, rec: rec, why: why})
	}
	if len(signed) == 0 && !k.prunable(s, now) {
		return nil, errors.Join(errs...)
	}
	var stored []CRLIssued
	_, err = Update(ctx, k.Store, func(s *State) error {
		stored = stored[:0]
		changed := s.PruneRevocations(now)+s.PruneCRLs() > 0
		for _, sc := range signed {
			if !k.current(s, sc, now) || !s.PutCRL(sc.rec) {
				continue // the state changed since: the next look signs again
			}
			changed = true
			stored = append(stored, CRLIssued{Issuer: sc.is.ID, Subject: sc.is.Cert.Subject.String(), Number: sc.rec.Number,
				Entries: len(v.CRLEntries(sc.is, now)), NextUpdate: sc.rec.NextUpdate, Why: sc.why})
		}
		if !changed {
			return errCRLNothing
		}
		return nil
	})
	switch {
	case errors.Is(err, errCRLNothing):
		stored = nil
	case err != nil:
		return nil, errors.Join(append(errs, err)...)
	}
	for _, is := range stored {
		if k.OnIssued != nil {
			k.OnIssued(is)
		}
	}
	return stored, errors.Join(errs...)
}

// current reports whether sc, signed for the state as it was loaded,
// still fits s: its issuer needs it, the number follows the stored one's,
// and it lists exactly s's revocations.
func (k *CRLKeeper) current(s *State, sc signedCRL, now time.Time) bool {
	v := s.View()
	is, ok := v.crlIssuer(sc.is.ID)
	if !ok {
		return false
	}
	base := big.NewInt(0)
	if rec, ok := v.CRL(is.ID); ok {
		base = rec.Number
	}
	if k.sourced(is) {
		return sc.rec.Number.Cmp(base) > 0 && listsAll(sc.rec.DER, v.CRLEntries(is, now))
	}
	return new(big.Int).Sub(sc.rec.Number, base).Cmp(big.NewInt(1)) == 0 && sameEntries(sc.rec.DER, v.CRLEntries(is, now))
}

// prunable reports whether s has a revocation expired at now or a CRL
// of a CA that no longer needs one.
func (k *CRLKeeper) prunable(s *State, now time.Time) bool {
	c := s.Clone()
	return c.PruneRevocations(now)+c.PruneCRLs() > 0
}

// sign makes is's next CRL at now.
func (k *CRLKeeper) sign(ctx context.Context, v View, is CRLIssuer, now time.Time) (CRLRecord, error) {
	if why := is.Problem(); why != "" {
		return CRLRecord{}, errors.New(why)
	}
	if k.sourced(is) {
		return k.fromSource(ctx, v, is, now)
	}
	tmpl := v.CRLTemplate(is, now, CRLBackdate, k.validity())
	var der []byte
	var err error
	switch {
	case is.Key != nil:
		der, err = x509.CreateRevocationList(rand.Reader, tmpl, is.Cert, is.Key)
	case k.Upstream == nil || is.Upstream.Type != k.UpstreamName:
		return CRLRecord{}, fmt.Errorf("its key is in upstream %s, and this server's upstream is %q: serve with --upstream %s", is.Upstream.Type, k.UpstreamName, is.Upstream.Type)
	default:
		sctx, cancel := context.WithTimeout(ctx, cmpOr(k.Timeout, DefaultRenewTimeout))
		defer cancel()
		der, err = k.Upstream.SignCRL(sctx, tmpl, is.Cert, is.Upstream)
	}
	if err != nil {
		return CRLRecord{}, err
	}
	l, err := x509.ParseRevocationList(der)
	if err != nil {
		return CRLRecord{}, fmt.Errorf("the signed CRL does not parse: %w", err)
	}
	if err := l.CheckSignatureFrom(is.Cert); err != nil {
		return CRLRecord{}, fmt.Errorf("the signed CRL is not signed by its issuer: %w", err)
	}
	return NewCRLRecord(is.ID, der)
}

// FirstCRL stores in s the first CRL of the CA id, signed with the key
// s holds for it: for an intermediate just renewed, which signs as soon
// as the state is followed, so that its CRL is in the same write and is
// published with it, not at the keeper's next look (a strict verifier
// refuses a certificate whose issuer has no CRL). Nothing when the CA
// needs no CRL, has one, or its key is not in s (the keeper's look then
// issues it, or reports why not).
func (k *CRLKeeper) FirstCRL(s *State, id string, now time.Time) error {
	v := s.View()
	is, ok := v.crlIssuer(id)
	if _, has := v.CRL(id); !ok || has || is.Key == nil || is.Problem() != "" {
		return nil
	}
	der, err := x509.CreateRevocationList(rand.Reader, v.CRLTemplate(is, now, CRLBackdate, k.validity()), is.Cert, is.Key)
	if err != nil {
		return fmt.Errorf("keymgr: the first CRL of %.16s: %w", id, err)
	}
	rec, err := NewCRLRecord(id, der)
	if err != nil {
		return err
	}
	s.PutCRL(rec)
	return nil
}

// Run ticks every Interval, and at once when poked (Poke), until ctx
// ends, then returns nil.
func (k *CRLKeeper) Run(ctx context.Context) error {
	last := ""
	tick := func() {
		_, err := k.Tick(ctx)
		switch {
		case err == nil:
			last = ""
		case ctx.Err() == nil && err.Error() != last:
			last = err.Error()
			if k.OnError != nil {
				k.OnError(err)
			}
		}
	}
	tick()
	every(ctx, k.Interval, DefaultCRLInterval, k.pokeChan(), tick)
	return nil
}

func (k *CRLKeeper) validity() time.Duration { return cmpOr(k.Validity, DefaultCRLValidity) }

func (k *CRLKeeper) refreshAt() float64 {
	if k.RefreshAt <= 0 || k.RefreshAt >= 1 {
		return DefaultCRLRefreshAt
	}
	return k.RefreshAt
}

func (k *CRLKeeper) now() time.Time {
	if k.Now == nil {
		return time.Now()
	}
	return k.Now()
}
