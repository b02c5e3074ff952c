package keymgr

import (
	"context"
	"crypto/ecdsa"
	"crypto/rsa"
	"errors"
	"fmt"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
)

// DefaultAutoRotateInterval is how often an AutoRotator looks for a due
// step.
const DefaultAutoRotateInterval = 30 * time.Second

// AutoRotator takes the steps of a rotation on its own for the
// authorities meshca generated, each as soon as View.Due says it is due:
// prepare when PrepareAt of the active root's lifetime is left, activate
// and retire as soon as their guards allow. It takes them through Update,
// so replicas sharing a store never take a step twice: whoever loses the
// race finds the step done. Imported authorities are left to an operator.
type AutoRotator struct {
	Store  StateStore
	Guards Guards
	Policy AutoPolicy
	// Generate makes the next root; NextRoot's when nil (the active
	// root's key type, organisation and lifetime).
	Generate func(active *AuthorityRecord) (*AuthorityRecord, error)
	// Dependents, when set, reads the certificates outside the workload
	// path each step must keep trusted and trusting (Guards.Dependents) at
	// every look; a dependent it cannot read holds activate and retire
	// back (its Err), not prepare.
	Dependents func(ctx context.Context) []Dependent
	// Interval between looks; DefaultAutoRotateInterval when zero.
	Interval time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// OnStep, when set, hears of every step taken; OnError of every
	// failure (the package does not log).
	OnStep  func(Step)
	OnError func(error)
}

// errNotDue: another writer took the step first.
var errNotDue = errors.New("keymgr: no rotation step due")

// Tick takes the step due now, if any, and reports it.
func (r *AutoRotator) Tick(ctx context.Context) (Step, bool, error) {
	now := r.now()
	s, _, err := r.Store.Load(ctx)
	if err != nil {
		return Step{}, false, err
	}
	g := r.Guards
	if r.Dependents != nil {
		g.Dependents = r.Dependents(ctx)
	}
	if _, due := s.View().Due(now, g, r.Policy); !due {
		return Step{}, false, nil
	}
	var taken Step
	_, err = Update(ctx, r.Store, func(s *State) error {
		step, due := s.View().Due(now, g, r.Policy)
		if !due {
			return errNotDue
		}
		taken = step
		const reason = "automatic rotation"
		switch step.Verb {
		case VerbPrepare:
			gen := r.Generate
			if gen == nil {
				gen = NextRoot
			}
			rec, err := gen(s.Active())
			if err != nil {
				return err
			}
			taken.ID = rec.ID()
			return s.Prepare(rec, now, reason+": "+step.Why)
		case VerbActivate:
			return s.Activate(step.ID, now, g, false, reason+": "+step.Why)
		case VerbRetire:
			return s.Retire(step.ID, now, g, false, reason+": "+step.Why)
		}
		return fmt.Errorf("keymgr: unknown rotation step %q", step.Verb)
	})
	switch {
	case errors.Is(err, errNotDue):
		return Step{}, false, nil
	case err != nil:
		return Step{}, false, err
	}
	return taken, true, nil
}

// Run ticks every Interval until ctx ends, then returns nil.
func (r *AutoRotator) Run(ctx context.Context) error {
	every(ctx, r.Interval, DefaultAutoRotateInterval, nil, func() {
		step, took, err := r.Tick(ctx)
		switch {
		case err != nil && ctx.Err() == nil && r.OnError != nil:
			r.OnError(err)
		case took && r.OnStep != nil:
			r.OnStep(step)
		}
	})
	return nil
}

func (r *AutoRotator) now() time.Time {
	if r.Now == nil {
		return time.Now()
	}
	return r.Now()
}

// NextRoot generates the root that follows active: a new, independent key
// of the same type, the same organisation, the same lifetime.
func NextRoot(active *AuthorityRecord) (*AuthorityRecord, error) {
	a, err := NewRoot(NextRootOptions(active))
	if err != nil {
		return nil, err
	}
	return &AuthorityRecord{Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true}, nil
}

// NextRootOptions describe the root that follows active's: its key
// type, organisation and lifetime.
func NextRootOptions(active *AuthorityRecord) RootOptions {
	o := RootOptions{KeyType: keyTypeOf(active.Root.PublicKey), TTL: active.Root.NotAfter.Sub(active.Root.NotBefore) - certs.Backdate}
	if org := active.Root.Subject.Organization; len(org) > 0 {
		o.Organization = org[0]
	}
	return o
}

// keyTypeOf is the KeyType of pub; certs.KeyECP256 for a key of a type meshca
// does not generate.
func keyTypeOf(pub any) certs.KeyType {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve.Params().BitSize == 384 {
			return certs.KeyECP384
		}
	case *rsa.PublicKey:
		switch k.N.BitLen() {
		case 3072:
			return certs.KeyRSA3072
		case 4096:
			return certs.KeyRSA4096
		}
		return certs.KeyRSA2048
	}
	return certs.KeyECP256
}
