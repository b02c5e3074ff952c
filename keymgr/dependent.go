package keymgr

import (
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
)

// A Dependent is a certificate outside the workload path that rides on the
// CA state's roots: istiod's serving certificate, which every proxy
// verifies against the bundle it holds, with the roots istiod verifies
// the proxies' certificates against. Guards.Dependents keep it trusted
// and trusting through a rotation: a step that would break either is
// refused until its keeper (meshca serve --istiod-cert-secret) has caught
// up with the state.
type Dependent struct {
	// Name says where it lives, for messages: "istiod's certificate
	// (istio-system/istiod-tls)".
	Name string
	// Chain is the certificate it serves, leaf first, with its
	// intermediates; empty when it has none yet.
	Chain []*x509.Certificate
	// Roots are the roots it trusts (istiod's ca.crt).
	Roots []*x509.Certificate
	// RenewAt is when its keeper renews it at the latest, whatever the
	// state does: two thirds of its life.
	RenewAt time.Time
	// Err, when set, is why it could not be read: every step it could
	// break waits.
	Err error
	// Restarter, when set, names what restarts the dependent's processes
	// ("Deployment istio-system/istiod"): istiod reads the roots it
	// verifies proxies' client certificates with only when it starts, so
	// a root in Roots is trusted once they restarted with it. Empty: Roots
	// stand for what it trusts.
	Restarter string
	// Loaded are the fingerprints of the roots its processes started
	// with, and Restarting says a restart is under way (then Loaded is
	// what the new ones load); both only with a Restarter.
	Loaded     []string
	Restarting bool
}

// activateHold is why activating rec would break d, or "": once rec
// signs, proxies present certificates under rec's root, which d must
// already trust.
func (d *Dependent) activateHold(rec *AuthorityRecord) string {
	switch {
	case d.Err != nil:
		return fmt.Sprintf("%s cannot be read (%v), so whether it trusts root %.16s cannot be checked", d.Name, d.Err, rec.RootID())
	case len(d.Chain) == 0:
		return fmt.Sprintf("%s holds no certificate yet, so whether it trusts root %.16s cannot be checked", d.Name, rec.RootID())
	case !containsCert(d.Roots, rec.Root):
		return fmt.Sprintf("%s does not trust root %.16s yet (its ca.crt lacks it), and would refuse the proxies' certificates it signs", d.Name, rec.RootID())
	case d.Restarter != "" && d.Restarting:
		return fmt.Sprintf("istiod is restarting (%s) to load root %.16s, which it reads only when it starts", d.Restarter, rec.RootID())
	case d.Restarter != "" && !slices.Contains(d.Loaded, rec.RootID()):
		return fmt.Sprintf("istiod (%s) has not restarted since its ca.crt gained root %.16s: it reads it only when it starts, "+
			"and would refuse the proxies' certificates that root signs", d.Restarter, rec.RootID())
	}
	return ""
}

// retireHold is why retiring rec from s would break d at now, or "": the
// proxies will hold the bundle without rec's root (when no other
// authority keeps it), and d's certificate must verify against it.
func (d *Dependent) retireHold(s *State, rec *AuthorityRecord, now time.Time) string {
	switch {
	case d.Err != nil:
		return fmt.Sprintf("%s cannot be read (%v), so whether it chains to a root that stays cannot be checked", d.Name, d.Err)
	case len(d.Chain) == 0:
		return fmt.Sprintf("%s holds no certificate yet, so whether it chains to a root that stays cannot be checked", d.Name)
	}
	var after []*x509.Certificate
	for _, r := range s.Bundle() {
		if !r.Equal(rec.Root) || s.View().rootKeptBy(rec) {
			after = append(after, r)
		}
	}
	leaf := d.Chain[0]
	if !now.Before(leaf.NotAfter) {
		return fmt.Sprintf("%s expired at %s under root %.16s and was not renewed under a root that stays", d.Name,
			leaf.NotAfter.UTC().Format(time.RFC3339), rec.RootID())
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: certs.Pool(after...), Intermediates: certs.Pool(d.Chain[1:]...),
		CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err == nil {
		return ""
	}
	return fmt.Sprintf("%s chains only to root %.16s, which retiring drops from the bundle: every proxy would refuse it (%v)", d.Name, rec.RootID(), err)
}

// rootKeptBy reports whether another authority of s, not retired, keeps
// rec's root in the bundle.
func (v View) rootKeptBy(rec *AuthorityRecord) bool {
	for _, a := range v.State.Authorities {
		if a != rec && a.Phase != PhaseRetired && a.Root.Equal(rec.Root) {
			return true
		}
	}
	return false
}

// dependentsHold is the first dependent of g that verb on rec would break,
// with why; nil when none would. Only activate and retire can.
func (g Guards) dependentsHold(s *State, verb string, rec *AuthorityRecord, now time.Time) (*Dependent, string) {
	for i := range g.Dependents {
		d := &g.Dependents[i]
		var why string
		switch verb {
		case VerbActivate:
			why = d.activateHold(rec)
		case VerbRetire:
			why = d.retireHold(s, rec, now)
		}
		if why != "" {
			return d, why
		}
	}
	return nil, ""
}

// dependentError is the guard's refusal of verb on rec for dependent d.
// Its keeper catches up as soon as it follows the state; at the latest at
// d.RenewAt, which SafeAt names when it is still ahead.
func dependentError(verb string, rec *AuthorityRecord, d *Dependent, why string, now time.Time) *GuardError {
	remedy := "; meshca serve --istiod-cert-secret rewrites it within seconds as it follows the CA state"
	if d.Restarter != "" {
		remedy += fmt.Sprintf(", and restarts istiod (%s) when its roots grow", d.Restarter)
	}
	e := &GuardError{Verb: verb, ID: rec.ID(), Now: now, Reason: why + remedy}
	switch {
	case d.RenewAt.After(now):
		e.SafeAt = d.RenewAt
		e.Reason += ", at the latest when it renews it"
	default:
		e.Until = "its keeper has rewritten it: is meshca serve with --istiod-cert-secret running? (meshca root status shows it)"
	}
	return e
}
