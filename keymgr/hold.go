package keymgr

import (
	"errors"
	"fmt"
	"time"
)

// DefaultCRLPropagation is how long, by default, an authority waits after
// it entered the CA state before it signs a leaf, when CRLs are kept: the
// time its first CRL takes to reach every verifier. istio-ca-crl goes to
// every namespace within a publisher round (seconds), and the kubelet
// updates a mounted ConfigMap within its sync period (a minute by
// default) and its cache's: two minutes covers both.
const DefaultCRLPropagation = 2 * time.Minute

// HeldAuthority is the signing authority s serves at now when a new
// signing authority is held back for hold after it entered the state:
// the time a verifier that refuses a CA of unknown revocation status
// (Envoy with a CRL, openssl; not ztunnel, which allows it) needs to
// receive the CRL stored with it. Until then the authority it replaced
// signs, if it still can; until names the end of the hold (zero when
// nothing is held), when the state must be put in service again.
//
// A renewed intermediate is stored with its first CRL and becomes active
// in the same write (State.Renew): without the hold its first leaves
// would reach peers before its CRL does. A root activated long after it
// was prepared is not held. hold of zero is StateAuthority.
func HeldAuthority(s *State, now time.Time, hold time.Duration) (a *Authority, until time.Time, err error) {
	if active := s.Active(); active != nil && hold > 0 && len(active.History) > 0 {
		until = active.History[0].At.Add(hold)
		if prev := s.View().replacedBy(active); prev != nil && now.Before(until) {
			if a, err := recordAuthority(s, prev, now); err == nil {
				return a, until, nil
			}
		}
	}
	// Not held, or nothing else can sign: the active authority signs at
	// once, as it would without a hold, rather than none.
	a, err = StateAuthority(s, now)
	return a, time.Time{}, err
}

// replacedBy is the authority that left the active phase when active
// entered it, if it holds its key and is not revoked: the one that may
// sign while active is held.
func (v View) replacedBy(active *AuthorityRecord) *AuthorityRecord {
	for _, p := range v.State.Authorities {
		if p.Phase != PhasePrevious || p.Key == nil || p.External || !p.Since().Equal(active.Since()) {
			continue
		}
		if v.revokedCA(p) {
			return nil
		}
		return p
	}
	return nil
}

// revokedCA reports whether the signing certificate of rec, a CA of the
// state other than a root that signs itself, is revoked in it.
func (v View) revokedCA(rec *AuthorityRecord) bool {
	if rec.SignsWithRoot() {
		return false
	}
	issuer, err := v.IssuerOf(rec.Cert)
	if err != nil {
		return true
	}
	for _, r := range v.State.Revocations {
		if r.Serial.Cmp(rec.Cert.SerialNumber) == 0 && (r.Issuer == "" || r.Issuer == issuer) {
			return true
		}
	}
	return false
}

// CheckHold checks hold, a CRL propagation time, against the life of the
// intermediates a renewer makes: the one replaced must outlive the hold
// with room to spare, or the new one would sign before its CRL is out;
// and a hold must end before the next renewal, or the one replaced would
// sign while its own CRL is still on its way.
func CheckHold(hold, intermediateTTL time.Duration, renewAt float64) error {
	switch {
	case hold < 0:
		return errors.New("the CRL propagation time is negative")
	case intermediateTTL <= 0:
		return nil
	}
	if renewAt <= 0 || renewAt >= 1 {
		renewAt = DefaultRenewAt
	}
	left := time.Duration(renewAt * float64(intermediateTTL))
	if every := intermediateTTL - left; hold >= every {
		return fmt.Errorf("the CRL propagation time %v is not shorter than the time between two renewals (%v): "+
			"lengthen the intermediate's life, renew it later, or shorten the propagation time", hold, every.Round(time.Second))
	}
	if hold > left/2 {
		return fmt.Errorf("the CRL propagation time %v is more than half of what is left of an intermediate when it is renewed (%v): "+
			"lengthen the intermediate's life or shorten the propagation time", hold, left.Round(time.Second))
	}
	return nil
}
