package keymgr_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/storetest"
	"github.com/meshca/meshca/keymgr/upstream"
)

// issuerIDs are the IDs of v's CRLIssuers, and which sign leaves.
func issuerIDs(v keymgr.View) (ids []string, leaves []string) {
	for _, is := range v.CRLIssuers() {
		ids = append(ids, is.ID)
		if is.SignsLeaves {
			leaves = append(leaves, is.ID)
		}
	}
	return ids, leaves
}

func TestCRLIssuers(t *testing.T) {
	now := time.Now()
	root := storetest.NewRecord(t, keymgr.PhaseActive, now)
	retired := storetest.NewRecord(t, keymgr.PhaseRetired, now)
	renewed := storetest.NewRenewedRecords(t, now, upstream.Ref{Type: "self"}, keymgr.PhasePrevious, keymgr.PhaseActive)
	transit := storetest.NewRenewedRecords(t, now, upstream.Ref{Type: "vault-transit", Key: "k:1"}, keymgr.PhasePrepared)[0]
	imported := storetest.NewIntermediateRecords(t, now, keymgr.PhaseActive)[0]
	noCRLSign := importedWithoutCRLSign(t, now)
	tests := []struct {
		name     string
		as       []*keymgr.AuthorityRecord
		want     []string
		leaves   []string
		problems []string
	}{
		{"a root that signs leaves", []*keymgr.AuthorityRecord{retired, root}, []string{root.ID()}, []string{root.ID()}, nil},
		{"intermediates renewed under one root", renewed, []string{renewed[0].ID(), renewed[0].RootID(), renewed[1].ID()},
			[]string{renewed[0].ID(), renewed[1].ID()}, nil},
		{"a prepared root in Vault Transit", []*keymgr.AuthorityRecord{root, transit}, []string{root.ID(), transit.ID(), transit.RootID()},
			[]string{root.ID(), transit.ID()}, nil},
		{"an imported chain", []*keymgr.AuthorityRecord{imported}, []string{imported.ID(), keymgr.Fingerprint(imported.Chain[0]), imported.RootID()},
			[]string{imported.ID()}, []string{"storetest intermediate 1", "meshca root"}},
		{"a root without cRLSign", []*keymgr.AuthorityRecord{root, noCRLSign}, []string{root.ID(), noCRLSign.ID()},
			[]string{root.ID(), noCRLSign.ID()}, []string{"lacks the cRLSign key usage"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := (&keymgr.State{Authorities: tt.as}).View()
			ids, leaves := issuerIDs(v)
			if !slices.Equal(ids, tt.want) || !slices.Equal(leaves, tt.leaves) {
				t.Fatalf("issuers %.16q (leaves %.16q), want %.16q (%.16q)", ids, leaves, tt.want, tt.leaves)
			}
			problems := v.CRLProblems()
			if len(problems) != len(tt.problems) {
				t.Fatalf("problems %q, want %d", problems, len(tt.problems))
			}
			for i, p := range tt.problems {
				if !strings.Contains(problems[i], p) {
					t.Errorf("problem %d = %q, want %q", i+1, problems[i], p)
				}
			}
		})
	}
}

// checkCRLs fails t unless s has a CRL for exactly the CAs that need one,
// each signed by its CA, valid at now, listing what the state revokes.
func checkCRLs(t *testing.T, s *keymgr.State, now time.Time) {
	t.Helper()
	v := s.View()
	want, _ := issuerIDs(v)
	var got []string
	for _, c := range s.CRLs {
		got = append(got, c.Issuer)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("CRLs of %.16q, want %.16q", got, want)
	}
	for _, is := range v.CRLIssuers() {
		rec, _ := v.CRL(is.ID)
		l, err := x509.ParseRevocationList(rec.DER)
		switch {
		case err != nil:
			t.Fatalf("CRL of %.16s: %v", is.ID, err)
		case l.CheckSignatureFrom(is.Cert) != nil:
			t.Fatalf("CRL of %.16s is not signed by it: %v", is.ID, l.CheckSignatureFrom(is.Cert))
		case !slices.Equal(l.AuthorityKeyId, is.Cert.SubjectKeyId):
			t.Fatalf("CRL of %.16s: AKI %x, want %x", is.ID, l.AuthorityKeyId, is.Cert.SubjectKeyId)
		case now.Before(l.ThisUpdate) || !now.Before(l.NextUpdate):
			t.Fatalf("CRL of %.16s valid %s to %s, not at %s", is.ID, l.ThisUpdate, l.NextUpdate, now)
		case len(l.RevokedCertificateEntries) != len(v.CRLEntries(is, now)):
			t.Fatalf("CRL of %.16s lists %d, want %d", is.ID, len(l.RevokedCertificateEntries), len(v.CRLEntries(is, now)))
		}
	}
}

// crlNumbers are the CRL numbers of s by issuer.
func crlNumbers(s *keymgr.State) map[string]int64 {
	out := map[string]int64{}
	for _, c := range s.CRLs {
		out[c.Issuer] = c.Number.Int64()
	}
	return out
}

// growing fails t when a number of before is not below after's.
func growing(t *testing.T, before, after map[string]int64) {
	t.Helper()
	for id, n := range before {
		if m, ok := after[id]; ok && m < n {
			t.Fatalf("CRL number of %.16s went from %d down to %d", id, n, m)
		}
	}
}

func crlTick(t *testing.T, k *keymgr.CRLKeeper) []keymgr.CRLIssued {
	t.Helper()
	issued, err := k.Tick(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return issued
}

// TestCRLKeeperIntermediateRenewal: through the renewals of an
// intermediate from the self upstream, every CA that needs a CRL has
// one at every step, the replaced intermediate's is dropped once it
// retires, the numbers only grow, and a CRL is reissued before half its
// validity has passed.
func TestCRLKeeperIntermediateRenewal(t *testing.T) {
	r, _, clock, store := renewFixtureOn(t, &codecStore{})
	k := &keymgr.CRLKeeper{Store: store, Now: clock.Now}
	if got := crlTick(t, k); len(got) != 2 || got[0].Number.Int64() != 1 {
		t.Fatalf("first tick issued %+v, want the intermediate's and the root's CRLs, number 1", got)
	}
	checkCRLs(t, load(t, store), clock.Now())
	if got := crlTick(t, k); len(got) != 0 {
		t.Fatalf("a second tick issued %+v", got)
	}
	numbers := crlNumbers(load(t, store))
	a0 := load(t, store).Active()
	for step := range 8 {
		clock.advance(6 * time.Hour)
		tick(t, r)
		crlTick(t, k)
		s := load(t, store)
		checkCRLs(t, s, clock.Now())
		n := crlNumbers(s)
		growing(t, numbers, n)
		numbers = n
		if old, _ := s.View().Lookup(a0.ID()); step == 7 && old.Phase != keymgr.PhaseRetired {
			t.Fatalf("after %d hours the first intermediate is %s", 6*(step+1), old.Phase)
		}
	}
	for id, n := range numbers {
		if id == a0.RootID() && n < 4 {
			t.Fatalf("the root's CRL was reissued %d times in 48h, want every 12h", n)
		}
	}
}

// TestRenewalStoredWithItsCRL: with CRLs kept, a renewed intermediate,
// which signs at once, is stored with its first CRL, before the keeper's
// next look: else a strict verifier refuses its first leaves (unknown
// revocation status) until that look, up to DefaultCRLInterval.
func TestRenewalStoredWithItsCRL(t *testing.T) {
	r, _, clock, store := renewFixtureOn(t, &codecStore{})
	k := &keymgr.CRLKeeper{Store: store, Now: clock.Now}
	r.CRLs = k
	crlTick(t, k)
	a0 := load(t, store).Active()
	var s *keymgr.State
	for range 8 { // until the renewal, with no look of the keeper
		clock.advance(6 * time.Hour)
		tick(t, r)
		if s = load(t, store); s.Active().ID() != a0.ID() {
			break
		}
	}
	a1 := s.Active()
	if a1.ID() == a0.ID() {
		t.Fatal("no renewal in 48h")
	}
	rec, ok := s.View().CRL(a1.ID())
	if !ok {
		t.Fatalf("the renewed intermediate %.16s is active with no CRL in the state", a1.ID())
	}
	if l, err := x509.ParseRevocationList(rec.DER); err != nil || l.CheckSignatureFrom(a1.Cert) != nil || rec.Number.Int64() != 1 {
		t.Fatalf("its CRL: %v, number %v", err, rec.Number)
	}
	for _, is := range crlTick(t, k) {
		if is.Issuer == a1.ID() {
			t.Fatalf("the keeper's next look issued %+v: the renewal's CRL should stand", is)
		}
	}
	checkCRLs(t, load(t, store), clock.Now())
}

// TestActivateWaitsForCRL: while the state keeps CRLs, a prepared
// authority is not activated before the keeper has issued the CRLs of
// its root and intermediate (a guard, until a condition), then is; force
// overrides it.
func TestActivateWaitsForCRL(t *testing.T) {
	clock := &fakeClock{now: lcT0}
	store := &codecStore{}
	a, b := lcGenerated(t), lcGenerated(t)
	k := &keymgr.CRLKeeper{Store: store, Now: clock.Now}
	update := func(change func(s *keymgr.State) error) {
		t.Helper()
		if _, err := keymgr.Update(t.Context(), store, change); err != nil {
			t.Fatal(err)
		}
	}
	update(func(s *keymgr.State) error { return s.Bootstrap(a, clock.Now(), "") })
	crlTick(t, k)
	clock.advance(48 * time.Hour)
	update(func(s *keymgr.State) error { return s.Prepare(b, clock.Now(), "") })
	clock.advance(48 * time.Hour)
	s := load(t, store)
	err := s.Clone().Activate(b.ID(), clock.Now(), keymgr.Guards{}, false, "")
	var ge *keymgr.GuardError
	if !errors.As(err, &ge) || !strings.Contains(err.Error(), "no CRL of its CA") || !strings.Contains(err.Error(), "safe once the serving leader has issued it") {
		t.Fatalf("activate before the keeper's look: %v, want a guard naming the missing CRL", err)
	}
	if err := s.Clone().Activate(b.ID(), clock.Now(), keymgr.Guards{}, true, "test"); err != nil {
		t.Fatalf("forced: %v", err)
	}
	crlTick(t, k)
	if err := load(t, store).Activate(b.ID(), clock.Now(), keymgr.Guards{}, false, ""); err != nil {
		t.Fatalf("activate once its CRL is issued: %v", err)
	}
}

// TestCRLKeeperRootRotation: a prepared root has its CRL before it
// signs; once it is active and the old root retired, the old one's is
// dropped.
func TestCRLKeeperRootRotation(t *testing.T) {
	clock := &fakeClock{now: lcT0}
	store := &codecStore{}
	a, b := lcGenerated(t), lcGenerated(t)
	k := &keymgr.CRLKeeper{Store: store, Now: clock.Now, Validity: 6 * time.Hour}
	steps := []struct {
		name    string
		advance time.Duration
		change  func(s *keymgr.State, now time.Time) error
		want    []*keymgr.AuthorityRecord
	}{
		{"bootstrap", 0, func(s *keymgr.State, now time.Time) error { return s.Bootstrap(a, now, "") }, []*keymgr.AuthorityRecord{a}},
		{"prepare", time.Hour, func(s *keymgr.State, now time.Time) error { return s.Prepare(b, now, "") }, []*keymgr.AuthorityRecord{a, b}},
		{"activate", 24 * time.Hour, func(s *keymgr.State, now time.Time) error {
			return s.Activate(b.ID(), now, keymgr.Guards{}, true, "test")
		}, []*keymgr.AuthorityRecord{a, b}},
		{"retire", 48 * time.Hour, func(s *keymgr.State, now time.Time) error {
			return s.Retire(a.ID(), now, keymgr.Guards{}, true, "test")
		}, []*keymgr.AuthorityRecord{b}},
	}
	for _, st := range steps {
		clock.advance(st.advance)
		if _, err := keymgr.Update(t.Context(), store, func(s *keymgr.State) error { return st.change(s, clock.Now()) }); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		crlTick(t, k)
		s := load(t, store)
		checkCRLs(t, s, clock.Now())
		if len(s.CRLs) != len(st.want) {
			t.Fatalf("%s: %d CRLs, want %d", st.name, len(s.CRLs), len(st.want))
		}
		for _, w := range st.want {
			if _, ok := s.View().CRL(w.ID()); !ok {
				t.Fatalf("%s: no CRL of %.16s", st.name, w.ID())
			}
		}
	}
}

// TestCRLKeeperRevocations: a revocation is listed at the next tick
// (an unknown issuer's on every leaf signer's CRL), taken back with
// Unrevoke, and gone with the revocation once it expired.
func TestCRLKeeperRevocations(t *testing.T) {
	_, _, clock, store := renewFixtureOn(t, &codecStore{})
	k := &keymgr.CRLKeeper{Store: store, Now: clock.Now}
	crlTick(t, k)
	s := load(t, store)
	a := s.Active()
	update := func(change func(s *keymgr.State) error) {
		t.Helper()
		if _, err := keymgr.Update(t.Context(), store, change); err != nil {
			t.Fatal(err)
		}
	}
	listed := func(issuer string) []int64 {
		t.Helper()
		rec, _ := load(t, store).View().CRL(issuer)
		l, err := x509.ParseRevocationList(rec.DER)
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for _, e := range l.RevokedCertificateEntries {
			out = append(out, e.SerialNumber.Int64())
		}
		return out
	}
	now := clock.Now()
	update(func(s *keymgr.State) error {
		_, err := s.Revoke([]keymgr.Revocation{rev(10, a.ID(), now), rev(11, "", now), rev(12, a.RootID(), now)}, now)
		return err
	})
	if got := crlTick(t, k); len(got) != 2 || got[0].Why != "the revocations changed" {
		t.Fatalf("issued %+v, want both CRLs reissued for the revocations", got)
	}
	if l, r := listed(a.ID()), listed(a.RootID()); !slices.Equal(l, []int64{10, 11}) || !slices.Equal(r, []int64{12}) {
		t.Fatalf("the intermediate's CRL lists %v, the root's %v; want [10 11] and [12]", l, r)
	}
	update(func(s *keymgr.State) error { return s.Unrevoke(big.NewInt(10), "") })
	crlTick(t, k)
	if l := listed(a.ID()); !slices.Equal(l, []int64{11}) {
		t.Fatalf("after Unrevoke the CRL lists %v, want [11]", l)
	}
	clock.advance(time.Hour + keymgr.RevocationGrace + time.Second)
	crlTick(t, k)
	s = load(t, store)
	if len(s.Revocations) != 0 || len(listed(a.ID())) != 0 || len(listed(a.RootID())) != 0 {
		t.Fatalf("expired revocations remain: %d in the state", len(s.Revocations))
	}
	checkCRLs(t, s, clock.Now())
}

// racingStore runs race once, before the first Save it is asked for.
type racingStore struct {
	keymgr.StateStore
	race func()
}

func (r *racingStore) Save(ctx context.Context, s *keymgr.State, base keymgr.Version) (keymgr.Version, error) {
	if f := r.race; f != nil {
		r.race = nil
		f()
	}
	return r.StateStore.Save(ctx, s, base)
}

// TestCRLKeeperConflict: two keepers (a leader change) issuing at once
// store one CRL per number: the loser stores nothing and finds nothing
// due afterwards.
func TestCRLKeeperConflict(t *testing.T) {
	_, _, clock, store := renewFixtureOn(t, &codecStore{})
	other := &keymgr.CRLKeeper{Store: store, Now: clock.Now}
	var otherIssued []keymgr.CRLIssued
	race := &racingStore{StateStore: store, race: func() { otherIssued = crlTick(t, other) }}
	k := &keymgr.CRLKeeper{Store: race, Now: clock.Now}
	got := crlTick(t, k)
	if len(otherIssued) != 2 || len(got) != 0 {
		t.Fatalf("the other keeper stored %d, this one %d; want 2 and 0", len(otherIssued), len(got))
	}
	s := load(t, store)
	for _, c := range s.CRLs {
		if c.Number.Int64() != 1 {
			t.Fatalf("CRL of %.16s has number %d after one issue, want 1", c.Issuer, c.Number)
		}
	}
	if got := crlTick(t, k); len(got) != 0 {
		t.Fatalf("after losing, the keeper issued %+v", got)
	}
	checkCRLs(t, s, clock.Now())
}

// TestCRLKeeperUpstreamAndProblems: a root whose key is in an upstream
// is signed there; a CA meshca cannot sign for is a CRLError, while the
// others' CRLs are stored.
func TestCRLKeeperUpstreamAndProblems(t *testing.T) {
	now := time.Now()
	// An intermediate under a root whose key is in Vault Transit: the
	// self upstream's, its root key taken out of the state.
	transit := storetest.NewRenewedRecords(t, now, upstream.Ref{Type: "self"}, keymgr.PhaseActive)[0]
	rootKey := transit.RootKey
	transit.RootKey, transit.Upstream = nil, upstream.Ref{Type: "vault-transit", Key: "k:1"}
	imported := storetest.NewIntermediateRecords(t, now, keymgr.PhasePrepared)[0]
	s := &keymgr.State{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{transit, imported}}
	calls := 0
	signer := &upstream.KeySigned{Name: "vault-transit", Key: func(_ context.Context, req *upstream.Request) (crypto.Signer, error) {
		calls++
		if req.Ref.Key != "k:1" {
			return nil, &upstream.Error{Upstream: "vault-transit", Kind: upstream.KindRefused, Err: errors.New("no such key")}
		}
		return rootKey, nil
	}}
	for _, tt := range []struct {
		name     string
		up       upstream.CRLSigner
		upName   string
		stored   int
		failures []string
	}{
		{"another upstream", signer, "pkcs11", 2, []string{"its key is in upstream vault-transit, and this server's upstream is \"pkcs11\"", "storetest intermediate 1", "meshca root"}},
		{"its upstream", signer, "vault-transit", 3, []string{"storetest intermediate 1", "meshca root"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			store := &codecStore{}
			if _, err := store.Save(t.Context(), s, ""); err != nil {
				t.Fatal(err)
			}
			k := &keymgr.CRLKeeper{Store: store, Upstream: tt.up, UpstreamName: tt.upName, Now: func() time.Time { return now }}
			issued, err := k.Tick(t.Context())
			if len(issued) != tt.stored {
				t.Fatalf("stored %d CRLs, want %d (err %v)", len(issued), tt.stored, err)
			}
			var ce *keymgr.CRLError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want CRLErrors", err)
			}
			for _, f := range tt.failures {
				if !strings.Contains(err.Error(), f) {
					t.Errorf("err = %v, want %q", err, f)
				}
			}
		})
	}
	if calls != 1 {
		t.Fatalf("the upstream was asked %d times, want once", calls)
	}
}

// TestCRLKeeperPoke: a keeper whose next look is an hour away issues the
// CRL of a revocation at once when poked, as serve pokes it on every
// change of the CA state; without the poke it would wait the hour.
func TestCRLKeeperPoke(t *testing.T) {
	_, _, clock, store := renewFixtureOn(t, &codecStore{})
	issued := make(chan keymgr.CRLIssued, 16)
	k := &keymgr.CRLKeeper{Store: store, Now: clock.Now, Interval: time.Hour, OnIssued: func(is keymgr.CRLIssued) { issued <- is }}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	wait := func(why string) {
		t.Helper()
		select {
		case is := <-issued:
			if is.Why != why {
				t.Fatalf("issued because %q, want %q", is.Why, why)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no CRL issued (%s) within 10s", why)
		}
	}
	// The first look issues the first CRL of every CA of the state, one
	// by one: wait for them all, or the last could pass for the poke's.
	for range load(t, store).View().CRLIssuers() {
		wait("it has no CRL yet")
	}
	a := load(t, store).Active()
	now := clock.Now()
	if _, err := keymgr.Update(t.Context(), store, func(s *keymgr.State) error {
		_, err := s.Revoke([]keymgr.Revocation{rev(10, a.ID(), now)}, now)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	k.Poke()
	wait("the revocations changed")
}
