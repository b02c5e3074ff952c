package keymgr

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// DefaultFollowInterval is how often a Follower reloads the stored state
// when nothing tells it sooner.
const DefaultFollowInterval = 2 * time.Second

// StateAuthority is the signing authority a state serves: its active
// authority's certificate, key and chain, trusting every root of the
// state's bundle.
func StateAuthority(s *State, now time.Time) (*Authority, error) {
	active := s.Active()
	switch {
	case active == nil:
		return nil, errors.New("keymgr: the CA state has no active authority")
	case active.Key == nil:
		return nil, fmt.Errorf("keymgr: active authority %.16s has no key here (it signs in an external backend)", active.ID())
	}
	a, err := recordAuthority(s, active, now)
	if err != nil {
		return nil, fmt.Errorf("keymgr: active authority %.16s: %w", active.ID(), err)
	}
	return a, nil
}

// recordAuthority is rec of s as a signing authority trusting s's
// bundle, valid at now.
func recordAuthority(s *State, rec *AuthorityRecord, now time.Time) (*Authority, error) {
	a := &Authority{Cert: rec.Cert, Key: rec.Key, Chain: rec.Chain, Roots: s.Bundle()}
	if err := a.Validate(now); err != nil {
		return nil, err
	}
	return a, nil
}

// A Target is what a Follower keeps on the stored state: a Manager (the
// built-in CA, which signs with the active authority's key) or an
// ExternalTrust (a backend that holds the keys itself).
type Target interface {
	// Use puts the validated state s in service, or refuses it and
	// changes nothing.
	Use(s *State, now time.Time) error
}

// A Rechecker is a Target whose choice depends on the time as well as on
// the state (Manager.HoldNew): RecheckAt is when the state in service
// must be put in service again; zero when never.
type Rechecker interface {
	RecheckAt() time.Time
}

// Follower keeps a Target on the state in a StateStore: it reloads the
// state every Interval, validates it, and puts it in service at once. A
// state that does not load or validate changes nothing: the last good one
// keeps serving, and OnError hears why. The package does not log.
type Follower struct {
	Store  StateStore
	Target Target
	// Interval between reloads; DefaultFollowInterval when zero.
	Interval time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// OnError, when set, hears why a state could not be used: once for each
	// failure that differs from the one before (Run), not at every look.
	OnError func(error)
	// OnChange, when set, hears of every state put in service.
	OnChange func(*State)

	mu      sync.Mutex // one Sync at a time: Run and a rotation step may both ask
	version Version
	loaded  bool
	state   *State // the state in service
}

// Sync loads the stored state once and, when it changed and is good, or
// the Target asks to see it again (Rechecker), puts it in service. It
// reports whether it did.
func (f *Follower) Sync(ctx context.Context) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, v, err := f.Store.Load(ctx)
	if err != nil {
		return false, fmt.Errorf("keymgr: loading the CA state: %w", err)
	}
	if f.loaded && v == f.version && !f.recheckDue() {
		return false, nil
	}
	if err := s.Validate(); err != nil {
		return false, fmt.Errorf("keymgr: CA state version %s is invalid, still serving the last good one: %w", v, err)
	}
	if err := notBehind(s, f.state, anyLineage(f.Store)); err != nil {
		return false, fmt.Errorf("keymgr: CA state version %s would take back the one in service, still serving that one: %w", v, err)
	}
	if err := f.Target.Use(s, f.now()); err != nil {
		return false, fmt.Errorf("keymgr: CA state version %s cannot serve, still serving the last good one: %w", v, err)
	}
	f.version, f.loaded, f.state = v, true, s
	if f.OnChange != nil {
		f.OnChange(s)
	}
	return true, nil
}

// anyLineage reports whether store's states may change lineage in
// service: a plugged-in directory's may, whose owner replaces its
// authority at will. A state store's may not: a state of another lineage
// was made anew (a lost store bootstrapped again), not from this one's
// history, and serving it would drop the roots live leaves chain to.
func anyLineage(store StateStore) bool {
	l, ok := store.(interface{ AnyLineage() bool })
	return ok && l.AnyLineage()
}

// notBehind refuses a state s that would take back what cur, the state
// in service, has done: a bundle sequence that goes down, an authority
// cur has retired in service again, or, unless anyLineage, another
// lineage (whatever its sequence: a state bootstrapped anew starts at 1,
// as an install that never rotated still is). Such a state is an older
// one written back (a backup restored, a Secret re-applied, a store
// deleted and bootstrapped anew by a restarting server): serving it
// would drop the roots of live leaves from the bundle, or sign again with
// a retired key.
func notBehind(s, cur *State, anyLineage bool) error {
	if cur == nil {
		return nil
	}
	if l := cur.View().Lineage(); !anyLineage && l != "" && s.View().Lineage() != l {
		return fmt.Errorf("it is another CA state (lineage %.16s, the one in service %.16s), made anew rather than from this one's history; "+
			"if it is meant, restart the servers on it", s.View().Lineage(), l)
	}
	if s.Sequence < cur.Sequence {
		return fmt.Errorf("its bundle sequence %d is below %d; if it is meant, restart the servers on it", s.Sequence, cur.Sequence)
	}
	for _, a := range cur.Authorities {
		for _, b := range s.Authorities {
			if a.Phase == PhaseRetired && b.Phase != PhaseRetired && b.ID() == a.ID() {
				return fmt.Errorf("it holds authority %.16s as %s, which was retired at %s; if it is meant, restart the servers on it",
					a.ID(), b.Phase, a.Since().UTC().Format(time.RFC3339))
			}
		}
	}
	return nil
}

// Run reloads the state every Interval until ctx ends, then returns nil.
// OnError hears of a failure once, until a look succeeds or fails
// otherwise: a state that stays broken is reported, not repeated every
// Interval.
func (f *Follower) Run(ctx context.Context) error {
	last := ""
	every(ctx, f.Interval, DefaultFollowInterval, nil, func() {
		_, err := f.Sync(ctx)
		switch {
		case err == nil:
			last = ""
		case ctx.Err() == nil && err.Error() != last:
			last = err.Error()
			if f.OnError != nil {
				f.OnError(err)
			}
		}
	})
	return nil
}

// every calls do every interval (def when it is not positive), and at
// once whenever wake fires (nil: never), until ctx ends.
func every(ctx context.Context, interval, def time.Duration, wake <-chan struct{}, do func()) {
	if interval <= 0 {
		interval = def
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
		do()
	}
}

// recheckDue reports whether the Target asked to use the state in
// service again by now.
func (f *Follower) recheckDue() bool {
	r, ok := f.Target.(Rechecker)
	if !ok {
		return false
	}
	at := r.RecheckAt()
	return !at.IsZero() && !f.now().Before(at)
}

func (f *Follower) now() time.Time {
	if f.Now == nil {
		return time.Now()
	}
	return f.Now()
}
