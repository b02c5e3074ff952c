package keymgr_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/self"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// codecStore keeps a state encoded, as a Secret does, with
// compare-and-swap on a counter.
type codecStore struct {
	mu      sync.Mutex
	entries map[string][]byte
	version int
}

func (c *codecStore) Load(context.Context) (*keymgr.State, keymgr.Version, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		return nil, "", keymgr.ErrNoState
	}
	s, err := keymgr.DecodeState(c.entries)
	return s, keymgr.Version(fmt.Sprint(c.version)), err
}

func (c *codecStore) Save(_ context.Context, s *keymgr.State, base keymgr.Version) (keymgr.Version, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := keymgr.Version(fmt.Sprint(c.version)); (c.entries != nil || base != "") && cur != base {
		return "", keymgr.ErrConflict
	}
	e, err := keymgr.EncodeState(s)
	if err != nil {
		return "", err
	}
	c.entries, c.version = e, c.version+1
	return keymgr.Version(fmt.Sprint(c.version)), nil
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *fakeClock) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// flaky is the self upstream, which can be made to fail and counts its
// calls.
type flaky struct {
	*upstream.KeySigned
	calls atomic.Int64
	mu    sync.Mutex
	err   error
	// answer, when set, replaces the answer.
	answer func(*upstream.Response) *upstream.Response
}

func (f *flaky) SignIntermediate(ctx context.Context, req *upstream.Request) (*upstream.Response, error) {
	f.calls.Add(1)
	f.mu.Lock()
	err, answer := f.err, f.answer
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	resp, err := f.KeySigned.SignIntermediate(ctx, req)
	if err == nil && answer != nil {
		resp = answer(resp)
	}
	return resp, err
}

func (f *flaky) fail(err error) { f.mu.Lock(); f.err = err; f.mu.Unlock() }

var renewTD = spiffeid.RequireTrustDomainFromString("renew.example")

// renewFixture is a state directory bootstrapped with a root of the self
// upstream and its first intermediate of 72 hours, at lcT0 on a fake
// clock, and a renewer for it.
func renewFixture(t *testing.T) (*keymgr.Renewer, *flaky, *fakeClock, keymgr.StateStore) {
	t.Helper()
	return renewFixtureOn(t, &dirstore.Store{Dir: filepath.Join(t.TempDir(), "state")})
}

func renewFixtureOn(t *testing.T, store keymgr.StateStore) (*keymgr.Renewer, *flaky, *fakeClock, keymgr.StateStore) {
	t.Helper()
	clock := &fakeClock{now: lcT0}
	u := &flaky{KeySigned: self.New()}
	u.KeySigned.Now = clock.Now
	r := newRenewer(store, u, clock)
	if _, err := keymgr.LoadOrBootstrap(t.Context(), store, func() (*keymgr.AuthorityRecord, error) {
		return r.NewAuthority(t.Context(), keymgr.RootOptions{Organization: "renew.example", TTL: lcRootTTL})
	}, clock.Now()); err != nil {
		t.Fatal(err)
	}
	return r, u, clock, store
}

func newRenewer(store keymgr.StateStore, u upstream.Upstream, clock *fakeClock) *keymgr.Renewer {
	return &keymgr.Renewer{Store: store, Upstream: u, Name: self.Name, TrustDomain: renewTD, Now: clock.Now, Jitter: func() float64 { return 0 },
		Guards: keymgr.Guards{Margin: 5 * time.Minute}}
}

func load(t *testing.T, store keymgr.StateStore) *keymgr.State {
	t.Helper()
	s, _, err := store.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func tick(t *testing.T, r *keymgr.Renewer) (keymgr.Renewal, bool) {
	t.Helper()
	rw, renewed, err := r.Tick(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return rw, renewed
}

// TestRenewerCycle: the intermediate is renewed when half its life is
// left, the renewal signs at once under the same root, the bundle and
// its sequence stay, the old intermediate retires once its leaves have
// expired, and years of renewals keep the state small.
func TestRenewerCycle(t *testing.T) {
	r, _, clock, store := renewFixtureOn(t, &codecStore{})
	first := load(t, store)
	a0 := first.Active()
	if !a0.Renewed() || a0.RootKey == nil || !a0.Generated || a0.Cert.NotAfter.Sub(lcT0) != keymgr.DefaultIntermediateTTL {
		t.Fatalf("bootstrapped %+v: want an intermediate of 72h renewed from self, the state keeping the root's key", a0.Upstream)
	}
	clock.advance(35 * time.Hour)
	if _, renewed := tick(t, r); renewed {
		t.Fatal("renewed with more than half its life left")
	}
	clock.advance(2 * time.Hour)
	rw, renewed := tick(t, r)
	if !renewed || rw.Old.ID() != a0.ID() || rw.New.Phase != keymgr.PhaseActive || rw.Clamped {
		t.Fatalf("renewal %+v, %v; want %.16s renewed, the renewal active", rw, renewed, a0.ID())
	}
	s := load(t, store)
	switch {
	case s.Active().ID() != rw.New.ID():
		t.Fatal("the stored state does not sign with the renewal")
	case s.Sequence != first.Sequence || len(s.Bundle()) != 1 || !s.Bundle()[0].Equal(a0.Root):
		t.Fatal("the renewal changed the trust bundle or its sequence")
	}
	// Leaves of a day were issued under the old one until now.
	if _, err := keymgr.Update(t.Context(), store, func(s *keymgr.State) error {
		s.RecordIssued(a0.ID(), clock.Now().Add(24*time.Hour), 24*time.Hour)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	clock.advance(24 * time.Hour)
	tick(t, r)
	if old, _ := load(t, store).View().Lookup(a0.ID()); old.Phase != keymgr.PhasePrevious {
		t.Fatal("retired before its leaves and the margin expired")
	}
	clock.advance(6 * time.Minute)
	tick(t, r)
	if old, _ := load(t, store).View().Lookup(a0.ID()); old.Phase != keymgr.PhaseRetired || old.Key != nil {
		t.Fatalf("the replaced intermediate is %s once its leaves expired, want retired, its key destroyed", old.Phase)
	}
	// A root's life of renewals every 36 hours.
	for range 60 * 24 / 36 {
		clock.advance(12 * time.Hour)
		tick(t, r)
	}
	s = load(t, store)
	entries, err := keymgr.EncodeState(s)
	if err != nil {
		t.Fatal(err)
	}
	size := 0
	for _, e := range entries {
		size += len(e)
	}
	if n := len(s.Authorities); n > keymgr.DefaultKeepRenewals+3 || size > 64<<10 {
		t.Fatalf("after 60 days: %d authorities, %d bytes; want at most %d and 64 KiB", n, size, keymgr.DefaultKeepRenewals+3)
	}
	if s.Active().Cert.NotAfter.Before(clock.Now()) || s.Active().Root != nil && !s.Active().Root.Equal(a0.Root) {
		t.Fatal("the active intermediate expired, or its root changed")
	}
}

// TestRenewerReplicasRenewOnce: two renewers (replicas) on one store,
// due at once, store one renewal.
func TestRenewerReplicasRenewOnce(t *testing.T) {
	r1, u, clock, store := renewFixture(t)
	r2 := newRenewer(store, u, clock)
	before := load(t, store)
	clock.advance(40 * time.Hour)
	var wg sync.WaitGroup
	var renewals atomic.Int64
	for _, r := range []*keymgr.Renewer{r1, r2} {
		wg.Go(func() {
			if _, renewed, err := r.Tick(t.Context()); err != nil {
				t.Error(err)
			} else if renewed {
				renewals.Add(1)
			}
		})
	}
	wg.Wait()
	s := load(t, store)
	if renewals.Load() != 1 || len(s.Authorities) != len(before.Authorities)+1 {
		t.Fatalf("%d renewals reported, %d authorities; want one renewal stored", renewals.Load(), len(s.Authorities))
	}
	// Whoever comes next finds nothing due.
	if _, renewed := tick(t, r2); renewed {
		t.Fatal("renewed twice")
	}
}

// TestRenewerBackoff: while the upstream fails, the intermediate in
// service stays, attempts back off (doubling, capped), a refusal backs
// off longer, and the upstream back renews without a restart.
func TestRenewerBackoff(t *testing.T) {
	r, u, clock, store := renewFixture(t)
	a0 := load(t, store).Active()
	clock.advance(40 * time.Hour)
	u.fail(&upstream.Error{Upstream: "self", Kind: upstream.KindUnavailable, Err: errors.New("sealed")})
	var waits []time.Duration
	for range 10 {
		if _, _, err := r.Tick(t.Context()); err == nil || upstream.KindOf(err) != upstream.KindUnavailable {
			t.Fatalf("err = %v, want the upstream's", err)
		}
		st := r.Status()
		waits = append(waits, st.Retry.Sub(clock.Now()))
		calls := u.calls.Load()
		clock.advance(st.Retry.Sub(clock.Now()) - time.Second)
		if _, renewed, err := r.Tick(t.Context()); renewed || err != nil || u.calls.Load() != calls {
			t.Fatal("called the upstream again before the backoff ended")
		}
		clock.advance(time.Second)
	}
	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 600, 600, 600}
	for i, w := range want {
		if waits[i] != w*time.Second {
			t.Fatalf("waits %v, want %v seconds", waits, want)
		}
	}
	if st := r.Status(); st.Failures != 10 || !strings.Contains(st.LastErr.Error(), "sealed") {
		t.Fatalf("status %+v", st)
	}
	if load(t, store).Active().ID() != a0.ID() {
		t.Fatal("the intermediate in service changed while the upstream failed")
	}
	u.fail(nil)
	clock.advance(10 * time.Minute)
	if _, renewed := tick(t, r); !renewed || r.Status().Failing() {
		t.Fatal("the upstream back, no renewal")
	}

	// A refusal backs off from 20 s.
	r2, u2, clock2, _ := renewFixture(t)
	clock2.advance(40 * time.Hour)
	u2.fail(&upstream.Error{Upstream: "self", Kind: upstream.KindRefused, Err: errors.New("permission denied")})
	_, _, _ = r2.Tick(t.Context())
	if w := r2.Status().Retry.Sub(clock2.Now()); w != 20*time.Second {
		t.Fatalf("a refusal waits %v, want 20s", w)
	}
}

// TestRenewerRefusesBadAnswer: an answer that breaks Check is never
// stored.
func TestRenewerRefusesBadAnswer(t *testing.T) {
	r, u, clock, store := renewFixture(t)
	before := load(t, store)
	clock.advance(40 * time.Hour)
	u.answer = func(resp *upstream.Response) *upstream.Response {
		resp.Chain = append(resp.Chain, before.Active().Root)
		return resp
	}
	_, _, err := r.Tick(t.Context())
	var ce *upstream.CheckError
	if !errors.As(err, &ce) || upstream.KindOf(err) != upstream.KindInternal {
		t.Fatalf("err = %v, want Check's refusal", err)
	}
	if s := load(t, store); len(s.Authorities) != len(before.Authorities) {
		t.Fatal("a refused answer was stored")
	}
}

// TestRenewerPrepared: a prepared authority's intermediate is renewed in
// its place, while the active one's is not due.
func TestRenewerPrepared(t *testing.T) {
	r, _, clock, store := renewFixture(t)
	clock.advance(30 * time.Hour)
	next, err := r.NewAuthority(t.Context(), keymgr.RootOptions{Organization: "renew.example", TTL: lcRootTTL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keymgr.Update(t.Context(), store, func(s *keymgr.State) error { return s.Prepare(next, clock.Now(), "next root") }); err != nil {
		t.Fatal(err)
	}
	clock.advance(10 * time.Hour) // the active one is due now
	if rw, _ := tick(t, r); rw.New.Phase != keymgr.PhaseActive {
		t.Fatalf("renewal %+v: want the active one first", rw)
	}
	clock.advance(30 * time.Hour) // the prepared one is due
	rw, renewed := tick(t, r)
	if !renewed || rw.Old.ID() != next.ID() || rw.Old.Phase != keymgr.PhaseRetired || rw.New.Phase != keymgr.PhasePrepared {
		t.Fatalf("renewal %+v, want the prepared one replaced", rw)
	}
	if rw.New.RootKey == nil || !rw.New.Root.Equal(next.Root) {
		t.Fatal("the prepared renewal lost its root or its root's key")
	}
}

// TestRenewerTakesOverRoot: a state whose root signs by itself, its key
// in the state, is moved to an intermediate under that root by its first
// renewal from self; another upstream refuses it.
func TestRenewerTakesOverRoot(t *testing.T) {
	clock := &fakeClock{now: lcT0}
	store := &dirstore.Store{Dir: filepath.Join(t.TempDir(), "state")}
	root := lcGenerated(t)
	if _, err := keymgr.LoadOrBootstrap(t.Context(), store, func() (*keymgr.AuthorityRecord, error) { return root, nil }, lcT0); err != nil {
		t.Fatal(err)
	}
	other := newRenewer(store, self.New(), clock)
	other.Name = "vault-transit"
	if _, _, err := other.Tick(t.Context()); upstream.KindOf(err) != upstream.KindRefused || !strings.Contains(err.Error(), "meshca root prepare --upstream vault-transit") {
		t.Fatalf("err = %v, want a refusal naming the way out", err)
	}
	u := self.New()
	u.Now = clock.Now
	rw, renewed := tick(t, newRenewer(store, u, clock))
	switch {
	case !renewed || rw.Old.ID() != root.ID() || rw.Old.Phase != keymgr.PhasePrevious:
		t.Fatalf("renewal %+v", rw)
	case !rw.New.Root.Equal(root.Root) || rw.New.SignsWithRoot() || rw.New.RootKey == nil || rw.New.Upstream.Type != self.Name:
		t.Fatal("the renewal is not an intermediate under the root, its key kept")
	}
}

// TestRenewerClampsToRoot: an intermediate never outlives its root; one
// that ends with its root is not renewed again.
func TestRenewerClampsToRoot(t *testing.T) {
	r, _, clock, store := renewFixture(t)
	root := load(t, store).Active().Root
	clock.now = root.NotAfter.Add(-50 * time.Hour)
	// The active intermediate expired long ago: it is due.
	rw, renewed := tick(t, r)
	if !renewed || !rw.Clamped || rw.New.Cert.NotAfter.After(root.NotAfter) {
		t.Fatalf("renewal %+v: want it cut to the root's end", rw)
	}
	clock.advance(40 * time.Hour)
	if _, renewed := tick(t, r); renewed {
		t.Fatal("renewed an intermediate that already ends with its root")
	}
}

// TestRenewerCountsFromIssue: an intermediate's backdated NotBefore does
// not move its renewal earlier: a short one is renewed at RenewAt of the
// life it was issued for.
func TestRenewerCountsFromIssue(t *testing.T) {
	r, _, clock, store := renewFixture(t)
	r.TTL = 80 * time.Second
	r.RenewAt = 0.75
	clock.advance(keymgr.DefaultIntermediateTTL) // the first one expired: renew it now
	rw, renewed := tick(t, r)
	if !renewed || rw.New.Cert.NotBefore.After(clock.Now().Add(-time.Minute)) {
		t.Fatalf("renewal %+v: want one, backdated", rw)
	}
	clock.advance(19 * time.Second)
	if _, renewed := tick(t, r); renewed {
		t.Fatal("renewed 19 s into 80: its backdate counted as life")
	}
	clock.advance(2 * time.Second)
	if _, renewed := tick(t, r); !renewed {
		t.Fatal("not renewed 21 s into 80, with less than three quarters left")
	}
	_ = store
}
