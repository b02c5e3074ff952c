package keymgr

import (
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/keymgr/certs"
)

// MinIDPrefix is the fewest hex digits of an id that Lookup accepts.
const MinIDPrefix = 8

// DefaultPrepareAt is the fraction of the active root's lifetime that is
// left when automatic rotation prepares the next root.
const DefaultPrepareAt = 1.0 / 3

// AutoPolicy holds the thresholds of automatic rotation, which applies
// only to authorities meshca generated.
type AutoPolicy struct {
	// PrepareAt is the fraction of the active authority's lifetime left
	// when the next one is prepared. Zero or less means DefaultPrepareAt;
	// more than 1 counts as 1.
	PrepareAt float64
}

func (p AutoPolicy) prepareAt() float64 {
	switch {
	case p.PrepareAt <= 0:
		return DefaultPrepareAt
	case p.PrepareAt > 1:
		return 1
	}
	return p.PrepareAt
}

// Step is a lifecycle step and when it becomes safe.
type Step struct {
	// Verb is VerbPrepare, VerbActivate or VerbRetire; empty when there is
	// nothing to do.
	Verb string
	// ID is the authority to activate or retire; empty for prepare.
	ID string
	// SafeAt is when the step becomes safe (or, for prepare, due); a time
	// at or before now means now.
	SafeAt time.Time
	// Why explains SafeAt to an operator.
	Why string
}

// Active returns the active authority, or nil when there is none.
func (s *State) Active() *AuthorityRecord {
	for _, a := range s.Authorities {
		if a.Phase == PhaseActive {
			return a
		}
	}
	return nil
}

// Lookup returns the authority whose id is idOrPrefix, or starts with it:
// at least MinIDPrefix hex digits that only one id starts with.
func (v View) Lookup(idOrPrefix string) (*AuthorityRecord, error) {
	return v.lookup(verbLookup, idOrPrefix)
}

func (v View) lookup(verb, idOrPrefix string) (*AuthorityRecord, error) {
	p := strings.ToLower(strings.TrimSpace(idOrPrefix))
	switch {
	case len(p) < MinIDPrefix:
		return nil, &StateError{Verb: verb, ID: idOrPrefix, Reason: fmt.Sprintf("an id needs at least %d hex digits", MinIDPrefix)}
	case strings.Trim(p, "0123456789abcdef") != "":
		return nil, &StateError{Verb: verb, ID: idOrPrefix, Reason: "an id is hex digits (the SHA-256 fingerprint of the authority's signing certificate)"}
	}
	var found *AuthorityRecord
	for _, a := range v.State.Authorities {
		if !strings.HasPrefix(a.ID(), p) {
			continue
		}
		if found != nil {
			return nil, &StateError{Verb: verb, ID: idOrPrefix, Reason: "more than one authority has an id starting so: give more digits"}
		}
		found = a
	}
	if found == nil {
		return nil, &StateError{Verb: verb, ID: idOrPrefix, Reason: "no authority has this id" + v.rootHint(p)}
	}
	return found, nil
}

// rootHint names the authorities under a root whose fingerprint starts
// with p, for one who gave a root's id (the id of an authority signing
// with an intermediate is the intermediate's fingerprint).
func (v View) rootHint(p string) string {
	var ids []string
	for _, a := range v.State.Authorities {
		if strings.HasPrefix(a.RootID(), p) {
			ids = append(ids, fmt.Sprintf("%.16s", a.ID()))
		}
	}
	if len(ids) == 0 {
		return ""
	}
	return fmt.Sprintf(": it is the root of %s; name an authority by its signing certificate's fingerprint", strings.Join(ids, ", "))
}

// find is lookup for a step that applies only to an authority in phase.
func (s *State) find(verb, idOrPrefix string, phase Phase) (*AuthorityRecord, error) {
	a, err := s.View().lookup(verb, idOrPrefix)
	if err != nil {
		return nil, err
	}
	if a.Phase != phase {
		return nil, &StateError{Verb: verb, ID: a.ID(), Reason: fmt.Sprintf("the authority is %s, not %s", a.Phase, phase)}
	}
	return a, nil
}

// Bundle returns the trust bundle: the roots of every prepared, active and
// previous authority, each once, in the order they were added.
func (s *State) Bundle() []*x509.Certificate {
	var roots []*x509.Certificate
	for _, a := range s.Authorities {
		switch a.Phase {
		case PhasePrepared, PhaseActive, PhasePrevious:
			if !containsCert(roots, a.Root) {
				roots = append(roots, a.Root)
			}
		}
	}
	return roots
}

// RetiredIssuers returns the signing certificates of the retired
// authorities whose roots are still trusted (another authority shares
// them): a leaf such a certificate issued still chains to the bundle, and
// only this list tells it from a leaf of a live authority.
func (v View) RetiredIssuers() []*x509.Certificate {
	trusted := v.State.Bundle()
	var out []*x509.Certificate
	for _, a := range v.State.Authorities {
		if a.Phase == PhaseRetired && containsCert(trusted, a.Root) && !containsCert(out, a.Cert) {
			out = append(out, a.Cert)
		}
	}
	return out
}

// InUseBy returns an authority of s other than rec, not retired, whose
// signing path (its root, signing certificate or chain) holds c or c's
// key, or nil: what retiring rec must leave in its backend.
func (v View) InUseBy(rec *AuthorityRecord, c *x509.Certificate) *AuthorityRecord {
	for _, a := range v.State.Authorities {
		if a.ID() == rec.ID() || a.Phase == PhaseRetired {
			continue
		}
		for _, x := range append([]*x509.Certificate{a.Cert, a.Root}, a.Chain...) {
			if x.Equal(c) || csr.SamePublicKey(x.PublicKey, c.PublicKey) {
				return a
			}
		}
	}
	return nil
}

// RecordIssued notes that a leaf valid until notAfter, with lifetime ttl,
// is issued under the authority id (a full id): the authority's
// LatestLeafNotAfter and LongestLeafTTL only grow. It reports whether
// either changed, when the caller must save the state before issuing.
func (s *State) RecordIssued(id string, notAfter time.Time, ttl time.Duration) bool {
	for _, a := range s.Authorities {
		if a.ID() != id {
			continue
		}
		changed := false
		if notAfter.After(a.LatestLeafNotAfter) {
			a.LatestLeafNotAfter, changed = notAfter.Round(0), true
		}
		if ttl > a.LongestLeafTTL {
			a.LongestLeafTTL, changed = ttl, true
		}
		return changed
	}
	return false
}

// RecordPrior notes that leaves of up to ttl may have been issued under
// the authority id until now by what signed with it before this state
// knew it (an earlier meshca, istiod, a cfssl server): leaves valid until
// now+ttl, or the authority's own expiry if sooner. It reports whether the
// record changed, as RecordIssued does.
func (s *State) RecordPrior(id string, ttl time.Duration, now time.Time) bool {
	for _, a := range s.Authorities {
		if a.ID() == id {
			return s.RecordIssued(id, minTime(now.Add(ttl), a.Cert.NotAfter), ttl)
		}
	}
	return false
}

// NextStep is the next step of a rotation and when it becomes safe, for
// an operator: activate the oldest prepared authority, else retire the
// oldest previous one, else prepare the next authority when automatic
// rotation would (DefaultPrepareAt of the active one's lifetime left).
func (v View) NextStep(now time.Time, g Guards) Step {
	if a := v.State.first(PhasePrepared); a != nil {
		return v.heldBy(Step{Verb: VerbActivate, ID: a.ID(), SafeAt: rules{v.State, g}.activationSafeAt(a), Why: rules{v.State, g}.activationWhy(a)}, a, now, g)
	}
	if a := v.State.first(PhasePrevious); a != nil {
		return v.heldBy(v.retireStep(a, now, g), a, now, g)
	}
	a := v.State.Active()
	if a == nil {
		return Step{Why: "the state has no authority yet: the server bootstraps one on its first start"}
	}
	st := prepareStep(a, AutoPolicy{})
	switch {
	case a.Renewed() && !a.Generated:
		st.Why += fmt.Sprintf("; the active root's key is in upstream %s, so this is up to an operator (meshca root prepare --upstream %s)", a.Upstream.Type, a.Upstream.Type)
	case a.External:
		st.Why += "; the active authority's key is in an external backend, so this is up to an operator (meshca root prepare --signer ...)"
	case !a.Generated:
		st.Why += "; the active authority was imported, so this is up to an operator"
	}
	return st
}

// heldBy is st, a step on rec whose time has come at now, as a
// dependent of g holds it back: its SafeAt and Why are the dependent's.
// A step whose time has not come, or that no dependent holds, is st.
func (v View) heldBy(st Step, rec *AuthorityRecord, now time.Time, g Guards) Step {
	if now.Before(st.SafeAt) {
		return st
	}
	d, why := g.dependentsHold(v.State, st.Verb, rec, now)
	if d == nil {
		return st
	}
	e := dependentError(st.Verb, rec, d, why, now)
	st.SafeAt, st.Why = e.SafeAt, e.Reason
	if e.Until != "" {
		st.Why += "; safe once " + e.Until
	}
	return st
}

// Due returns the step automatic rotation takes at now, if any: it drives
// only authorities meshca generated. Activate a generated prepared
// authority as soon as its guard allows (its dependents included);
// retire a generated previous one as soon as its guard allows; prepare a new one when the active one is
// generated, nothing is prepared, and no more than p.PrepareAt of its
// lifetime is left.
func (v View) Due(now time.Time, g Guards, p AutoPolicy) (Step, bool) {
	prepared := false
	for _, a := range v.State.Authorities {
		switch {
		case a.Phase == PhasePrepared && a.Generated && !now.Before(rules{v.State, g}.activationSafeAt(a)) && v.unheld(VerbActivate, a, now, g):
			return Step{Verb: VerbActivate, ID: a.ID(), SafeAt: rules{v.State, g}.activationSafeAt(a), Why: rules{v.State, g}.activationWhy(a)}, true
		case a.Phase == PhasePrevious && a.Generated && !now.Before(retireSafeAt(a, g)) && v.unheld(VerbRetire, a, now, g):
			return v.retireStep(a, now, g), true
		case a.Phase == PhasePrepared:
			prepared = true
		case a.Phase == PhasePrevious && a.Generated && !a.Root.Equal(activeRoot(v.State)):
			// One rotation at a time: the next root waits until this one,
			// retired automatically once its leaves expire, has left the
			// bundle. An intermediate renewed under the active root
			// leaves no root behind.
			prepared = true
		}
	}
	a := v.State.Active()
	if a == nil || !a.Generated || prepared {
		return Step{}, false
	}
	if st := prepareStep(a, p); !now.Before(st.SafeAt) {
		return st, true
	}
	return Step{}, false
}

// unheld reports whether no dependent of g holds verb on a back.
func (v View) unheld(verb string, a *AuthorityRecord, now time.Time, g Guards) bool {
	d, _ := g.dependentsHold(v.State, verb, a, now)
	return d == nil
}

// activeRoot is the active authority's root; nil without one.
func activeRoot(s *State) *x509.Certificate {
	if a := s.Active(); a != nil {
		return a.Root
	}
	return nil
}

func (s *State) first(phase Phase) *AuthorityRecord {
	for _, a := range s.Authorities {
		if a.Phase == phase {
			return a
		}
	}
	return nil
}

func (v View) retireStep(a *AuthorityRecord, now time.Time, g Guards) Step {
	safeAt := retireSafeAt(a, g)
	var why string
	switch {
	case a.LatestLeafNotAfter.IsZero():
		why = "no leaf was issued under it"
	case !now.Before(safeAt):
		why = "every leaf issued under it has expired"
	default:
		why = rules{v.State, g}.retireWhy(a)
	}
	return Step{Verb: VerbRetire, ID: a.ID(), SafeAt: safeAt, Why: why}
}

// prepareStep is the prepare step that replaces active, due when
// p.PrepareAt of its lifetime is left. Its lifetime runs from its signing
// certificate's NotBefore to the first NotAfter of its signing path; for
// an authority whose intermediate meshca renews, it is its root's, which
// the next root replaces (the renewer keeps the intermediate).
func prepareStep(active *AuthorityRecord, p AutoPolicy) Step {
	start := active.Cert.NotBefore
	end := certs.EarliestExpiry(append([]*x509.Certificate{active.Cert, active.Root}, active.Chain...)...)
	if active.Renewed() {
		start, end = active.Root.NotBefore, active.Root.NotAfter
	}
	life := max(end.Sub(start), 0)
	at := end.Add(-time.Duration(p.prepareAt() * float64(life)))
	return Step{Verb: VerbPrepare, SafeAt: at, Why: fmt.Sprintf("%.0f%% of the lifetime of the active authority %.16s is left at %s; it expires at %s",
		100*p.prepareAt(), active.ID(), at.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339))}
}
