package keymgr_test

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// lcUnder returns a new authority signed by an intermediate of its own
// directly under root, valid for lcRootTTL from an hour before lcT0.
func lcUnder(t *testing.T, root *testca.CA, name string) *keymgr.AuthorityRecord {
	t.Helper()
	o := testca.Options{NotBefore: lcT0.Add(-time.Hour), NotAfter: lcT0.Add(lcRootTTL)}
	issuing := root.NewIntermediate(t, name, o)
	return &keymgr.AuthorityRecord{Root: root.Cert, Cert: issuing.Cert, Key: issuing.Key}
}

func lcBundleIs(t *testing.T, s *keymgr.State, want ...*x509.Certificate) {
	t.Helper()
	got := s.Bundle()
	if len(got) != len(want) {
		t.Fatalf("the bundle holds %d roots, want %d", len(got), len(want))
	}
	for i := range want {
		if !got[i].Equal(want[i]) {
			t.Fatalf("bundle root %d is %q, want %q", i+1, got[i].Subject, want[i].Subject)
		}
	}
}

// TestIntermediateRenewal walks an intermediate renewed under the root
// workloads already trust: the new one is an authority of its own, may
// sign as soon as the root has been served long enough (which it has),
// the old one retires once its leaves expire, and the root stays in the
// bundle, once, throughout.
func TestIntermediateRenewal(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	root := testca.NewRoot(t, "corporate root", testca.Options{NotBefore: lcT0.Add(-time.Hour), NotAfter: lcT0.Add(lcRootTTL)})
	s := &keymgr.State{}
	first := lcUnder(t, root, "issuing 1")
	if err := s.Bootstrap(first, lcT0, "imported"); err != nil {
		t.Fatal(err)
	}
	s.RecordIssued(first.ID(), h(44*time.Hour), 24*time.Hour)

	// 20h later the intermediate is renewed. Its root has been served
	// since lcT0, longer than half the leaves' life and the margin.
	second := lcUnder(t, root, "issuing 2")
	if err := s.Prepare(second, h(20*time.Hour), "renewed intermediate"); err != nil {
		t.Fatal(err)
	}
	if second.ID() == first.ID() || second.RootID() != first.RootID() {
		t.Fatal("two intermediates under one root must have their own ids and share the root's")
	}
	lcBundleIs(t, s, root.Cert)
	if st := s.View().NextStep(h(20*time.Hour), keymgr.DefaultGuards()); st.Verb != keymgr.VerbActivate || st.ID != second.ID() || st.SafeAt.After(h(20*time.Hour)) {
		t.Fatalf("next step %+v, want to activate %.16s now", st, second.ID())
	}
	if err := s.Activate(second.ID(), h(20*time.Hour), keymgr.DefaultGuards(), false, "renewal"); err != nil {
		t.Fatal(err)
	}
	lcBundleIs(t, s, root.Cert)

	// A new root prepared at the same moment would wait the full guard.
	fresh := lcGenerated(t)
	if err := s.Prepare(fresh, h(20*time.Hour), "next root"); err != nil {
		t.Fatal(err)
	}
	err := s.Activate(fresh.ID(), h(20*time.Hour), keymgr.DefaultGuards(), false, "")
	lcCheckErr(t, err, true, "safe at 2030-01-02T08:05:00Z")
	lcBundleIs(t, s, root.Cert, fresh.Root)

	// The first intermediate retires once its leaves expire; the root
	// stays, since the second one signs under it.
	err = s.Retire(first.ID(), h(30*time.Hour), keymgr.Guards{}, false, "")
	lcCheckErr(t, err, true, "leaves issued under it can be valid until 2030-01-02T20:00:00Z, and retiring it stops them renewing by mTLS (its root stays")
	_, err = s.View().Lookup(first.RootID())
	lcCheckErr(t, err, false, "it is the root of "+first.ID()[:16]+", "+second.ID()[:16]+"; name an authority by its signing certificate's fingerprint")
	if err := s.Retire(first.ID(), h(44*time.Hour), keymgr.Guards{}, false, "renewed"); err != nil {
		t.Fatal(err)
	}
	if first.Key != nil {
		t.Error("the retired intermediate's key was kept")
	}
	lcBundleIs(t, s, root.Cert, fresh.Root)
	if r := s.View().RetiredIssuers(); len(r) != 1 || !r[0].Equal(first.Cert) {
		t.Fatalf("retired issuers %d, want the first intermediate: its leaves still chain to the bundle", len(r))
	}
	// What retiring the first one must leave in a backend: the root,
	// which the second signs under; not its own intermediate.
	if by := s.View().InUseBy(first, root.Cert); by != second {
		t.Errorf("the shared root is in use by %v, want the second intermediate's authority", by)
	}
	if by := s.View().InUseBy(first, first.Cert); by != nil {
		t.Errorf("the retired intermediate is in use by %.16s, want none", by.ID())
	}
	// Both targets a server keeps on the state tell its retired issuer.
	mgr := keymgr.NewManager(spiffeid.RequireTrustDomainFromString("cluster.local"), nil)
	trust := keymgr.NewExternalTrust(spiffeid.RequireTrustDomainFromString("cluster.local"), keymgr.DefaultGuards())
	for name, target := range map[string]interface {
		keymgr.Target
		RetiredIssuer(*x509.Certificate) bool
	}{"Manager": mgr, "ExternalTrust": trust} {
		if err := target.Use(s, h(44*time.Hour)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !target.RetiredIssuer(first.Cert) || target.RetiredIssuer(second.Cert) {
			t.Errorf("%s: RetiredIssuer wrong for the retired or the active intermediate", name)
		}
	}

	// A third intermediate under the root is welcome while it is trusted.
	if err := s.Prepare(lcUnder(t, root, "issuing 3"), h(45*time.Hour), ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestRetiredRootStaysOut: once every authority of a root is retired,
// the root is out of the bundle for good: an intermediate under it is
// refused.
func TestRetiredRootStaysOut(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	root := testca.NewRoot(t, "old root", testca.Options{NotBefore: lcT0.Add(-time.Hour), NotAfter: lcT0.Add(lcRootTTL)})
	s := &keymgr.State{}
	old := lcUnder(t, root, "issuing")
	oldKey := old.Key // retire destroys the record's
	if err := s.Bootstrap(old, lcT0, ""); err != nil {
		t.Fatal(err)
	}
	next := lcGenerated(t)
	if err := s.Prepare(next, lcT0, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Activate(next.ID(), h(time.Hour), keymgr.DefaultGuards(), false, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Retire(old.ID(), h(2*time.Hour), keymgr.Guards{}, false, ""); err != nil {
		t.Fatal(err)
	}
	lcBundleIs(t, s, next.Root)
	if r := s.View().RetiredIssuers(); len(r) != 0 {
		t.Fatalf("%d retired issuers, want none: the retired root is out of the bundle", len(r))
	}
	seq, n := s.Sequence, len(s.Authorities)
	err := s.Prepare(lcUnder(t, root, "issuing again"), h(3*time.Hour), "")
	lcCheckErr(t, err, false, "its root was retired at 2030-01-01T02:00:00Z and a retired root is not trusted again: prepare a new root")
	// Nor under the same root re-issued with its key.
	again := testca.NewRoot(t, "old root, re-issued", testca.Options{Key: root.Key, NotBefore: lcT0.Add(-time.Hour), NotAfter: lcT0.Add(lcRootTTL)})
	err = s.Prepare(lcUnder(t, again, "issuing under it"), h(3*time.Hour), "")
	lcCheckErr(t, err, false, "a retired root is not trusted again")
	// Nor a new certificate for the retired intermediate's key.
	reissued := (&testca.CA{Cert: next.Root, Key: next.Key}).NewIntermediate(t, "re-issued",
		testca.Options{Key: oldKey, NotBefore: lcT0.Add(-time.Hour), NotAfter: lcT0.Add(lcRootTTL)})
	err = s.Prepare(&keymgr.AuthorityRecord{Root: next.Root, Cert: reissued.Cert, Key: oldKey}, h(3*time.Hour), "")
	lcCheckErr(t, err, false, "its signing key is that of retired authority")
	if s.Sequence != seq || len(s.Authorities) != n {
		t.Error("a refused prepare changed the state")
	}
}
