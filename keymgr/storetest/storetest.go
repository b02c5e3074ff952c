// Package storetest is the contract every keymgr.StateStore passes. A
// store's test calls Run with a function that returns a new, empty store
// for each case; the suite saves states built with keymgr.NewRoot and
// checks what comes back.
package storetest

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
)

// concurrentSavers is how many writers race in the concurrency cases.
const concurrentSavers = 4

// Run runs the contract suite. newStore returns a new, empty store; each
// case calls it once, and runs its concurrent writers on the one store it
// got.
func Run(t *testing.T, newStore func(t *testing.T) keymgr.StateStore) {
	f := newFixtures(t)
	cases := []struct {
		name string
		run  func(t *testing.T, st keymgr.StateStore, f *fixtures)
	}{
		{"EmptyIsNoState", testEmpty},
		{"RoundTrip", testRoundTrip},
		{"MixedPhasesRoundTrip", testMixed},
		{"SharedRootRoundTrip", testSharedRoot},
		{"UpstreamRoundTrip", testUpstream},
		{"RevocationsRoundTrip", testRevocations},
		{"RootKeyDestroyedWithItsLastAuthority", testRootKeyDestroyed},
		{"RetiredKeyDestroyed", testRetiredKeyDestroyed},
		{"StaleBaseConflicts", testStaleBase},
		{"SecondCreateConflicts", testSecondCreate},
		{"BaseOnEmptyStoreConflicts", testBaseOnEmpty},
		{"ConcurrentSavesOneWins", testConcurrentSaves},
		{"ConcurrentCreatesOneWins", testConcurrentCreates},
		{"RefusedStateStoresNothing", testRefused},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, newStore(t), f) })
	}
}

// fixtures are the authorities the cases build states from, generated
// once per Run.
type fixtures struct {
	at time.Time
	// one is a single active, generated root.
	one *keymgr.AuthorityRecord
	// mixed holds every phase: retired (with a key the store must
	// destroy), previous (RSA), active (an intermediate under its root),
	// prepared, and prepared and external (no key).
	mixed []*keymgr.AuthorityRecord
	// renewal is an intermediate renewal under one root: retired,
	// previous and active authorities that share it.
	renewal []*keymgr.AuthorityRecord
	// upstream is a root that signed by itself, then had intermediates
	// renewed from the self upstream under it (the state keeps the
	// root's key): a previous root authority, a retired, a previous and
	// an active renewal; beside it, a prepared renewal whose root key
	// is in another upstream.
	upstream []*keymgr.AuthorityRecord
	// spare are single active roots for the racing writers.
	spare []*keymgr.AuthorityRecord
}

func newFixtures(t *testing.T) *fixtures {
	t.Helper()
	// Sub-second on purpose: stores may keep times to the second only.
	at := time.Now().Add(-time.Hour).Add(123456789 * time.Nanosecond)
	f := &fixtures{at: at, one: NewRecord(t, keymgr.PhaseActive, at)}
	retired := NewRecord(t, keymgr.PhaseRetired, at.Add(-48*time.Hour))
	retired.LatestLeafNotAfter, retired.LongestLeafTTL = at.Add(-49*time.Hour), 24*time.Hour
	previous := newRecord(t, keymgr.PhasePrevious, at.Add(-time.Hour), certs.KeyRSA2048)
	previous.LatestLeafNotAfter, previous.LongestLeafTTL = at.Add(23*time.Hour+500*time.Millisecond), 24*time.Hour
	active := NewIntermediateRecords(t, at, keymgr.PhaseActive)[0]
	active.LatestLeafNotAfter, active.LongestLeafTTL = at.Add(time.Hour), 90*time.Minute+time.Millisecond
	prepared := NewRecord(t, keymgr.PhasePrepared, at)
	external := NewRecord(t, keymgr.PhasePrepared, at)
	external.Key, external.External, external.Generated = nil, true, false
	f.mixed = []*keymgr.AuthorityRecord{retired, previous, active, prepared, external}
	f.renewal = NewIntermediateRecords(t, at, keymgr.PhaseRetired, keymgr.PhasePrevious, keymgr.PhaseActive)
	f.renewal[1].LatestLeafNotAfter, f.renewal[1].LongestLeafTTL = at.Add(12*time.Hour), 24*time.Hour
	f.upstream = upstreamFixture(t, at)
	for range concurrentSavers {
		f.spare = append(f.spare, NewRecord(t, keymgr.PhaseActive, at))
	}
	return f
}

func state(seq uint64, rs ...*keymgr.AuthorityRecord) *keymgr.State {
	return &keymgr.State{Sequence: seq, Authorities: rs}
}

func testEmpty(t *testing.T, st keymgr.StateStore, _ *fixtures) {
	s, v, err := st.Load(context.Background())
	if !errors.Is(err, keymgr.ErrNoState) {
		t.Fatalf("Load of an empty store = %v, %q, %v; want ErrNoState", s, v, err)
	}
}

func testRoundTrip(t *testing.T, st keymgr.StateStore, f *fixtures) {
	want := state(1, f.one)
	v := save(t, st, want, "")
	expect(t, st, want, v)
}

func testMixed(t *testing.T, st keymgr.StateStore, f *fixtures) {
	want := state(9, f.mixed...)
	v := save(t, st, want, "")
	expect(t, st, want, v)
}

// testSharedRoot: authorities that share a root (an intermediate renewed
// under it) are kept apart, each with its own key.
func testSharedRoot(t *testing.T, st keymgr.StateStore, f *fixtures) {
	want := state(4, f.renewal...)
	v := save(t, st, want, "")
	expect(t, st, want, v)
}

// testRevocations: revocations, node blocks and CRLs come back.
func testRevocations(t *testing.T, st keymgr.StateStore, f *fixtures) {
	want := state(9, f.mixed...)
	active := f.mixed[2]
	revs := []keymgr.Revocation{
		{Serial: big.NewInt(0x2a), Issuer: active.ID(), Reason: 1, RevokedAt: f.at, NotAfter: f.at.Add(48 * time.Hour), Subject: "spiffe://td/ns/a/sa/b", Node: "node-a", By: "storetest"},
		{Serial: big.NewInt(7), RevokedAt: f.at, NotAfter: f.at.Add(48 * time.Hour)},
	}
	if _, err := want.Revoke(revs, f.at); err != nil {
		t.Fatal(err)
	}
	if err := want.Block(keymgr.NodeBlock{Node: "node-a", Since: f.at.Add(-time.Hour), At: f.at, Reason: "stolen", By: "storetest"}); err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.RevocationList{Number: big.NewInt(3), ThisUpdate: f.at.Add(-time.Minute), NextUpdate: f.at.Add(24 * time.Hour),
		RevokedCertificateEntries: []x509.RevocationListEntry{{SerialNumber: big.NewInt(0x2a), RevocationTime: f.at}}}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, active.Cert, active.Key)
	if err != nil {
		t.Fatal(err)
	}
	crl, err := keymgr.NewCRLRecord(active.ID(), der)
	if err != nil {
		t.Fatal(err)
	}
	want.CRLs = []keymgr.CRLRecord{crl}
	v := save(t, st, want, "")
	expect(t, st, want, v)
}

// upstreamFixture is fixtures.upstream.
func upstreamFixture(t *testing.T, at time.Time) []*keymgr.AuthorityRecord {
	self := upstream.Ref{Type: "self"}
	renewed := NewRenewedRecords(t, at, self, keymgr.PhaseRetired, keymgr.PhasePrevious, keymgr.PhaseActive)
	rootKey := renewed[2].RootKey
	adopted := &keymgr.AuthorityRecord{Phase: keymgr.PhasePrevious, Root: renewed[0].Root, Cert: renewed[0].Root, Key: rootKey,
		Generated: true, History: historyTo(keymgr.PhasePrevious, at.Add(-time.Hour))}
	renewed[1].LatestLeafNotAfter, renewed[1].LongestLeafTTL = at.Add(12*time.Hour), 24*time.Hour
	other := NewRenewedRecords(t, at, upstream.Ref{Type: "vault-transit", Key: "meshca-root-2"}, keymgr.PhasePrepared)[0]
	return append([]*keymgr.AuthorityRecord{adopted}, append(renewed, other)...)
}

// testUpstream: authorities renewed from an upstream keep it, and share
// their root's key, kept once for them all and for the authority that
// signed with the root itself.
func testUpstream(t *testing.T, st keymgr.StateStore, f *fixtures) {
	want := state(5, f.upstream...)
	v := save(t, st, want, "")
	got := expect(t, st, want, v)
	if got.Authorities[0].Key == nil || got.Authorities[3].RootKey == nil {
		t.Fatal("the root's key was not kept")
	}
}

// testRootKeyDestroyed: once every authority under a root is retired,
// its key is gone.
func testRootKeyDestroyed(t *testing.T, st keymgr.StateStore, f *fixtures) {
	v1 := save(t, st, state(5, f.upstream...), "")
	rs := make([]*keymgr.AuthorityRecord, len(f.upstream))
	for i, a := range f.upstream {
		r := *a
		if i < 4 {
			r.Key, r.RootKey = nil, nil
			r.History = append(append([]keymgr.Transition(nil), a.History...), keymgr.Transition{To: keymgr.PhaseRetired, At: f.at.Add(time.Minute)})
			if r.Phase == keymgr.PhaseRetired {
				r.History = a.History
			}
			r.Phase = keymgr.PhaseRetired
		}
		rs[i] = &r
	}
	rs[4].Phase, rs[4].History = keymgr.PhaseActive, historyTo(keymgr.PhaseActive, f.at)
	want := state(6, rs...)
	v2 := save(t, st, want, v1)
	got := expect(t, st, want, v2)
	for i, a := range got.Authorities[:4] {
		if a.Key != nil || a.RootKey != nil {
			t.Fatalf("authority %d came back with a key after its root's last authority retired", i+1)
		}
	}
}

func testRetiredKeyDestroyed(t *testing.T, st keymgr.StateStore, f *fixtures) {
	old := NewRecord(t, keymgr.PhasePrevious, f.at)
	v1 := save(t, st, state(2, old, f.one), "")
	got := expect(t, st, state(2, old, f.one), v1)
	if got.Authorities[0].Key == nil {
		t.Fatal("a previous authority lost its key")
	}
	retired := *old
	retired.Phase = keymgr.PhaseRetired
	retired.History = append(append([]keymgr.Transition(nil), old.History...), keymgr.Transition{To: keymgr.PhaseRetired, At: f.at.Add(time.Minute), Reason: "storetest: retire"})
	want := state(3, &retired, f.one)
	v2 := save(t, st, want, v1)
	got = expect(t, st, want, v2)
	if got.Authorities[0].Key != nil {
		t.Fatal("Load returned the key of a retired authority: it must be destroyed")
	}
}

func testStaleBase(t *testing.T, st keymgr.StateStore, f *fixtures) {
	v1 := save(t, st, state(1, f.one), "")
	want := state(2, f.spare[0])
	v2 := save(t, st, want, v1)
	if v2 == v1 {
		t.Fatalf("Save returned the version it was based on, %q", v1)
	}
	if _, err := st.Save(context.Background(), state(3, f.spare[1]), v1); !errors.Is(err, keymgr.ErrConflict) {
		t.Fatalf("Save on the stale version: %v, want ErrConflict", err)
	}
	expect(t, st, want, v2)
}

func testSecondCreate(t *testing.T, st keymgr.StateStore, f *fixtures) {
	want := state(1, f.one)
	v := save(t, st, want, "")
	if _, err := st.Save(context.Background(), state(1, f.spare[0]), ""); !errors.Is(err, keymgr.ErrConflict) {
		t.Fatalf("a second Save on the zero version: %v, want ErrConflict", err)
	}
	expect(t, st, want, v)
}

func testBaseOnEmpty(t *testing.T, st keymgr.StateStore, f *fixtures) {
	if _, err := st.Save(context.Background(), state(1, f.one), "made-up-version"); !errors.Is(err, keymgr.ErrConflict) {
		t.Fatalf("Save on a version an empty store never had: %v, want ErrConflict", err)
	}
	testEmpty(t, st, f)
	want := state(1, f.one)
	v := save(t, st, want, "")
	if _, err := st.Save(context.Background(), state(2, f.spare[0]), "made-up-version"); !errors.Is(err, keymgr.ErrConflict) {
		t.Fatalf("Save on a made-up version: %v, want ErrConflict", err)
	}
	expect(t, st, want, v)
}

func testConcurrentSaves(t *testing.T, st keymgr.StateStore, f *fixtures) {
	base := save(t, st, state(1, f.one), "")
	race(t, st, f, base)
}

func testConcurrentCreates(t *testing.T, st keymgr.StateStore, f *fixtures) {
	race(t, st, f, "")
}

// race has concurrentSavers writers save different states on base at
// once: exactly one must win, and the store must hold its state.
func race(t *testing.T, st keymgr.StateStore, f *fixtures, base keymgr.Version) {
	t.Helper()
	states := make([]*keymgr.State, concurrentSavers)
	versions := make([]keymgr.Version, concurrentSavers)
	errs := make([]error, concurrentSavers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range concurrentSavers {
		states[i] = state(uint64(10+i), previousOf(f.one), f.spare[i])
		wg.Go(func() {
			<-start
			versions[i], errs[i] = st.Save(context.Background(), states[i], base)
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("writers %d and %d both saved on version %q", winner, i, base)
		case err == nil:
			winner = i
		case !errors.Is(err, keymgr.ErrConflict):
			t.Fatalf("writer %d: %v, want nil or ErrConflict", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("every writer lost: one must win")
	}
	expect(t, st, states[winner], versions[winner])
}

// previousOf is r moved on to previous.
func previousOf(r *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
	p := *r
	p.Phase = keymgr.PhasePrevious
	p.History = append(append([]keymgr.Transition(nil), r.History...), keymgr.Transition{To: keymgr.PhasePrevious, At: r.Since().Add(time.Minute)})
	return &p
}

func testRefused(t *testing.T, st keymgr.StateStore, f *fixtures) {
	bad := *f.one
	bad.Key = f.spare[0].Key
	if _, err := st.Save(context.Background(), state(1, &bad), ""); err == nil || errors.Is(err, keymgr.ErrConflict) {
		t.Fatalf("Save of an authority whose key is not its certificate's: %v, want an error other than ErrConflict", err)
	}
	testEmpty(t, st, f)
}

func save(t *testing.T, st keymgr.StateStore, s *keymgr.State, base keymgr.Version) keymgr.Version {
	t.Helper()
	v, err := st.Save(context.Background(), s, base)
	if err != nil {
		t.Fatalf("Save on version %q: %v", base, err)
	}
	if v == "" {
		t.Fatal("Save returned the zero Version")
	}
	return v
}

// expect loads the store and checks it holds want at version v.
func expect(t *testing.T, st keymgr.StateStore, want *keymgr.State, v keymgr.Version) *keymgr.State {
	t.Helper()
	got, gv, err := st.Load(context.Background())
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if gv != v {
		t.Errorf("Load version %q, Save returned %q", gv, v)
	}
	if d := Diff(got, want); d != "" {
		t.Fatalf("Load returned another state than was saved: %s", d)
	}
	return got
}
