package keymgr

import (
	"crypto/x509"
	"fmt"
	"strings"
	"time"
)

// The verbs of the lifecycle, as they appear in errors and in Step.
const (
	VerbBootstrap = "bootstrap"
	VerbPrepare   = "prepare"
	VerbActivate  = "activate"
	VerbRetire    = "retire"

	verbLookup   = "lookup"
	verbValidate = "validate"
)

// DefaultGuardMargin is what the guards add, by default, to the
// wait they compute: time for every server to serve a new bundle, for a
// workload whose renewal failed once to retry, and for clocks that
// disagree (the CLI's machine, the servers', the workloads').
const DefaultGuardMargin = 5 * time.Minute

// Guards tune the guards of the lifecycle steps. The zero Guards has no
// margin; DefaultGuards has the default one.
type Guards struct {
	// Margin is added to each guard's wait: to half the longest leaf
	// lifetime before a prepared root may become active, and to the
	// expiry of the last leaf issued under a previous authority before
	// it may be retired. A negative Margin counts as zero.
	Margin time.Duration
	// Dependents are the certificates outside the workload path a step
	// must keep trusted and trusting (istiod's): activate waits until
	// each trusts the new root, retire until none chains only to the
	// root it drops.
	Dependents []Dependent
}

func (g Guards) margin() time.Duration { return max(g.Margin, 0) }

// DefaultGuards returns the Guards meshca uses unless told otherwise.
func DefaultGuards() Guards { return Guards{Margin: DefaultGuardMargin} }

// GuardError is a step a guard refuses now, and that becomes safe at
// SafeAt. The CLI exits 1 on it; --force with a reason overrides it.
type GuardError struct {
	Verb string
	// ID is the full id of the authority the step was asked for.
	ID     string
	Reason string
	SafeAt time.Time
	// Until, when SafeAt is zero, says what makes the step safe: a
	// condition no clock decides (a dependent's keeper catching up).
	Until string
	// Now is when the guard refused; the message counts the wait from it.
	Now time.Time
}

func (e *GuardError) Error() string {
	if e.SafeAt.IsZero() && e.Until != "" {
		return fmt.Sprintf("keymgr: %s %.16s refused: %s; safe once %s", e.Verb, e.ID, e.Reason, e.Until)
	}
	msg := fmt.Sprintf("keymgr: %s %.16s refused: %s; safe at %s", e.Verb, e.ID, e.Reason, ceilSecond(e.SafeAt).UTC().Format(time.RFC3339))
	if e.Now.IsZero() {
		return msg
	}
	return fmt.Sprintf("%s (in %s)", msg, ceilDuration(e.SafeAt.Sub(e.Now)))
}

// ceilDuration rounds d up to a whole second.
func ceilDuration(d time.Duration) time.Duration {
	if r := d.Truncate(time.Second); r < d {
		return r + time.Second
	}
	return d.Truncate(time.Second)
}

// ceilSecond rounds t up to a whole second, so that a "safe at" never
// names a moment when the step is still refused.
func ceilSecond(t time.Time) time.Time {
	if c := t.Truncate(time.Second); c.Before(t) {
		return c.Add(time.Second)
	}
	return t
}

// StateError is a step that can never apply to the state as it is: an
// unknown id, an authority in the wrong phase, an invalid record, a force
// without a reason. The CLI exits 2 on it.
type StateError struct {
	Verb string
	// ID is the authority's full id, or what was asked for when no
	// authority matched; empty when the step names none.
	ID     string
	Reason string
}

func (e *StateError) Error() string {
	if e.ID == "" {
		return fmt.Sprintf("keymgr: %s: %s", e.Verb, e.Reason)
	}
	return fmt.Sprintf("keymgr: %s %.16s: %s", e.Verb, e.ID, e.Reason)
}

// Bootstrap adds rec as the first authority of s, active at once: its
// history shows it prepared and activated at now, both for reason. It is
// refused once s has an active authority (use Prepare). On success s owns
// rec; on error neither changes.
func (s *State) Bootstrap(rec *AuthorityRecord, now time.Time, reason string) error {
	if a := s.Active(); a != nil {
		return &StateError{Verb: VerbBootstrap, Reason: fmt.Sprintf("the state already has an active authority (%.16s): prepare the next one instead", a.ID())}
	}
	if err := s.checkNew(VerbBootstrap, rec, now); err != nil {
		return err
	}
	rec.enter(PhasePrepared, now, reason, false)
	rec.enter(PhaseActive, now, reason, false)
	s.Authorities = append(s.Authorities, rec)
	s.Sequence++
	return nil
}

// Prepare adds rec to s as prepared: its root joins the trust bundle, it
// does not sign. rec must be new (no phase, no history, a root not in s)
// and valid at now: Root a self-signed CA; Cert a CA allowed to sign
// certificates, either Root itself (then no Chain) or chaining to Root
// through Chain (which holds neither); Key matching Cert, or no Key when
// External; every certificate within its validity. A state without an
// active authority takes its first one by Bootstrap. On success s owns
// rec; on error neither changes.
func (s *State) Prepare(rec *AuthorityRecord, now time.Time, reason string) error {
	if s.Active() == nil {
		return &StateError{Verb: VerbPrepare, Reason: "the state has no active authority yet: bootstrap adds the first one"}
	}
	if err := s.checkNew(VerbPrepare, rec, now); err != nil {
		return err
	}
	rec.enter(PhasePrepared, now, reason, false)
	s.Authorities = append(s.Authorities, rec)
	s.Sequence++
	return nil
}

// Activate makes the prepared authority id (or a unique prefix of it) sign
// from now on; the active one becomes previous at the same instant.
//
// The guard: workloads learn a root only from the bundle of their next
// renewal, at half their leaf's life, so the prepared root must have been
// in the bundle for half the longest leaf lifetime issued under the active
// or a previous authority, plus g.Margin. force overrides the guard and
// needs a non-empty reason; nothing makes an authority active outside its
// validity period.
func (s *State) Activate(id string, now time.Time, g Guards, force bool, reason string) error {
	if err := checkForce(VerbActivate, id, force, reason); err != nil {
		return err
	}
	rec, err := s.find(VerbActivate, id, PhasePrepared)
	if err != nil {
		return err
	}
	if why := validityAt(rec, now); why != "" {
		return &StateError{Verb: VerbActivate, ID: rec.ID(), Reason: why}
	}
	r := rules{s, g}
	if safeAt := r.activationSafeAt(rec); !force && now.Before(safeAt) {
		return &GuardError{Verb: VerbActivate, ID: rec.ID(), SafeAt: safeAt, Now: now, Reason: r.activationWhy(rec)}
	}
	if d, why := g.dependentsHold(s, VerbActivate, rec, now); !force && d != nil {
		return dependentError(VerbActivate, rec, d, why, now)
	}
	if why := s.View().crlMissing(rec); !force && why != "" {
		return &GuardError{Verb: VerbActivate, ID: rec.ID(), Reason: why, Now: now,
			Until: "the serving leader has issued it (meshca serve --crl looks every 10s) and published it"}
	}
	if old := s.Active(); old != nil {
		old.enter(PhasePrevious, now, supersededReason(rec, reason), force)
	}
	rec.enter(PhaseActive, now, reason, force)
	s.Sequence++
	return nil
}

func supersededReason(by *AuthorityRecord, reason string) string {
	if reason == "" {
		return fmt.Sprintf("superseded by %.16s", by.ID())
	}
	return fmt.Sprintf("superseded by %.16s: %s", by.ID(), reason)
}

// Retire drops the previous authority id (or a unique prefix of it) from
// the trust bundle and destroys its key (Key becomes nil). Its root stays
// in the bundle while another authority that is not retired shares it;
// the bundle's sequence grows only when the root leaves.
//
// The guard: it is refused while a leaf issued under it can still be
// valid, until its LatestLeafNotAfter, plus g.Margin for a clock (the
// caller's, or a workload's) that runs apart from the one that recorded
// it. force overrides the guard and needs a non-empty reason.
func (s *State) Retire(id string, now time.Time, g Guards, force bool, reason string) error {
	if err := checkForce(VerbRetire, id, force, reason); err != nil {
		return err
	}
	rec, err := s.find(VerbRetire, id, PhasePrevious)
	if err != nil {
		return err
	}
	if safeAt := retireSafeAt(rec, g); !force && now.Before(safeAt) {
		return &GuardError{Verb: VerbRetire, ID: rec.ID(), SafeAt: safeAt, Now: now, Reason: rules{s, g}.retireWhy(rec)}
	}
	if d, why := g.dependentsHold(s, VerbRetire, rec, now); !force && d != nil {
		return dependentError(VerbRetire, rec, d, why, now)
	}
	kept := s.View().rootKeptBy(rec)
	rec.enter(PhaseRetired, now, reason, force)
	rec.Key, rec.RootKey = nil, nil
	if !kept {
		// Its root leaves the bundle. An intermediate retired under a
		// root another authority keeps changes no bundle.
		s.Sequence++
	}
	return nil
}

// retireSafeAt is when the previous authority rec may be retired: g's
// margin after the last leaf issued under it expires; at once when none
// was.
func retireSafeAt(rec *AuthorityRecord, g Guards) time.Time {
	if rec.LatestLeafNotAfter.IsZero() {
		return time.Time{}
	}
	return rec.LatestLeafNotAfter.Add(g.margin())
}

func (r rules) retireWhy(rec *AuthorityRecord) string {
	until := ceilSecond(rec.LatestLeafNotAfter).UTC().Format(time.RFC3339)
	if m := r.g.margin(); m > 0 {
		until += fmt.Sprintf(" (and %s more for clocks that disagree)", m)
	}
	for _, a := range r.s.Authorities {
		if a != rec && a.Phase != PhaseRetired && a.Root.Equal(rec.Root) {
			return fmt.Sprintf("leaves issued under it can be valid until %s, and retiring it stops them renewing by mTLS "+
				"(its root stays: authority %.16s signs under it)", until, a.ID())
		}
	}
	return fmt.Sprintf("leaves issued under it can be valid until %s, and workloads holding them need its root", until)
}

// activationSafeAt is when the prepared authority rec may become active:
// when its root entered the bundle, plus half the longest leaf lifetime
// issued under an authority whose leaves may still be live (the active one
// and every previous one), plus r.g.Margin. An intermediate under a root
// that is served already waits only as long as that root has not been.
func (r rules) activationSafeAt(rec *AuthorityRecord) time.Time {
	return r.rootServedSince(rec.Root).Add(r.liveLeafTTL()/2 + r.g.margin())
}

func (r rules) activationWhy(rec *AuthorityRecord) string {
	return fmt.Sprintf("its root entered the bundle at %s and workloads learn it only when they renew, at half their leaf's life: "+
		"it must be served for half the longest leaf lifetime (%s) plus a margin (%s)",
		r.rootServedSince(rec.Root).UTC().Format(time.RFC3339), r.liveLeafTTL(), r.g.margin())
}

// rootServedSince is when root entered the trust bundle to stay: the
// start of the run of authorities of s under it that reaches now, one
// following another without a gap (a renewal retires one and prepares
// the next at the same instant). Each kept the root in the bundle from
// when it was prepared until it was retired. Zero when no authority
// under root is in the bundle.
func (r rules) rootServedSince(root *x509.Certificate) time.Time {
	var since time.Time
	for _, a := range r.s.Authorities {
		if a.Phase == PhaseRetired || !a.Root.Equal(root) || len(a.History) == 0 {
			continue
		}
		if at := a.History[0].At; since.IsZero() || at.Before(since) {
			since = at
		}
	}
	for more := !since.IsZero(); more; {
		more = false
		for _, a := range r.s.Authorities {
			if a.Phase != PhaseRetired || !a.Root.Equal(root) || len(a.History) == 0 {
				continue
			}
			if from, to := a.History[0].At, a.Since(); from.Before(since) && !to.Before(since) {
				since, more = from, true
			}
		}
	}
	return since
}

// liveLeafTTL is the longest leaf lifetime issued under the active
// authority or a previous one: workloads holding such leaves renew, and
// learn a new root, only half that long after their leaf was issued.
func (r rules) liveLeafTTL() time.Duration {
	var ttl time.Duration
	for _, a := range r.s.Authorities {
		if a.Phase == PhaseActive || a.Phase == PhasePrevious {
			ttl = max(ttl, a.LongestLeafTTL)
		}
	}
	return ttl
}

func checkForce(verb, id string, force bool, reason string) error {
	if force && strings.TrimSpace(reason) == "" {
		return &StateError{Verb: verb, ID: id, Reason: "a forced step needs a reason, recorded in the history"}
	}
	return nil
}

// enter appends the transition to phase to r's history.
func (r *AuthorityRecord) enter(to Phase, now time.Time, reason string, forced bool) {
	r.Phase = to
	r.History = append(r.History, Transition{To: to, At: now.Round(0), Reason: reason, Forced: forced})
}
