package keymgr

import (
	"fmt"
	"time"
)

// VerbRenew is the verb of an intermediate's renewal from its upstream,
// as it appears in errors.
const VerbRenew = "renew"

// DefaultKeepRenewals is how many retired intermediates of each root
// PruneRenewed keeps by default: enough history to read, bounded so that
// years of intermediates a few days long keep the CA state small.
const DefaultKeepRenewals = 8

// Renew puts rec, an intermediate renewed from its upstream under the
// root of the authority id (active or prepared), in id's place at now.
// Workloads already trust that root, so the trust bundle does not change,
// nor does its sequence:
//
//   - an active id becomes previous, and rec active at once (prepared and
//     activated at now): no guard applies, since whoever trusts the
//     active authority's leaves trusts their root, rec's, already (and
//     istiod, a dependent, too);
//   - a prepared id (a root rotation under way whose intermediate nears
//     its end) is retired, its key destroyed, and rec prepared in its
//     place: the root stays in the bundle, and the activation guard
//     counts from when id's root entered it.
//
// rec must be new and valid at now as Prepare requires, under id's root,
// and Renewed. On success s owns rec; on error neither changes.
func (s *State) Renew(id string, rec *AuthorityRecord, now time.Time, reason string) error {
	old, err := s.View().lookup(VerbRenew, id)
	if err != nil {
		return err
	}
	switch {
	case old.Phase != PhaseActive && old.Phase != PhasePrepared:
		return &StateError{Verb: VerbRenew, ID: old.ID(), Reason: fmt.Sprintf("the authority is %s: only an active or a prepared one is renewed", old.Phase)}
	case rec == nil || rec.Root == nil || !rec.Root.Equal(old.Root):
		return &StateError{Verb: VerbRenew, ID: old.ID(), Reason: "the renewal is not under the authority's root"}
	case !rec.Renewed():
		return &StateError{Verb: VerbRenew, ID: old.ID(), Reason: "the renewal names no upstream"}
	}
	if err := s.checkNew(VerbRenew, rec, now); err != nil {
		return err
	}
	if old.Phase == PhasePrepared {
		old.enter(PhaseRetired, now, renewedReason(rec, reason), false)
		old.Key, old.RootKey = nil, nil
		rec.enter(PhasePrepared, now, reason, false)
		s.Authorities = append(s.Authorities, rec)
		return nil
	}
	old.enter(PhasePrevious, now, renewedReason(rec, reason), false)
	rec.enter(PhasePrepared, now, reason, false)
	rec.enter(PhaseActive, now, reason, false)
	s.Authorities = append(s.Authorities, rec)
	return nil
}

func renewedReason(by *AuthorityRecord, reason string) string {
	if reason == "" {
		return fmt.Sprintf("renewed by %.16s", by.ID())
	}
	return fmt.Sprintf("renewed by %.16s: %s", by.ID(), reason)
}

// PruneRenewed drops from s the retired intermediates renewed from an
// upstream beyond the newest keep of each root (DefaultKeepRenewals when
// keep is not positive), once every leaf they issued has expired at now.
// It never drops the first authority, whose id and start name the
// state's lineage, and always leaves a root a retired record newer than
// the ones it drops, so that a retired root is still known as one. It
// reports how many it dropped; the bundle does not change.
func (s *State) PruneRenewed(now time.Time, keep int) int {
	if keep <= 0 {
		keep = DefaultKeepRenewals
	}
	kept := map[string]int{}
	drop := map[*AuthorityRecord]bool{}
	for i := len(s.Authorities) - 1; i > 0; i-- {
		a := s.Authorities[i]
		if a.Phase != PhaseRetired || !a.Renewed() {
			continue
		}
		if kept[a.RootID()] < keep || now.Before(a.LatestLeafNotAfter) {
			kept[a.RootID()]++
			continue
		}
		drop[a] = true
	}
	if len(drop) == 0 {
		return 0
	}
	out := s.Authorities[:0]
	for _, a := range s.Authorities {
		if !drop[a] {
			out = append(out, a)
		}
	}
	clear(s.Authorities[len(out):])
	s.Authorities = out
	return len(drop)
}
