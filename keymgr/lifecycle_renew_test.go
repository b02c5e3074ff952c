package keymgr_test

import (
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/upstream"
)

// lcSelfRoot is a root whose key the CA state keeps (the self
// upstream), valid for lcRootTTL from an hour before lcT0.
func lcSelfRoot(t *testing.T, name string) *testca.CA {
	t.Helper()
	return testca.NewRoot(t, name, testca.Options{NotBefore: lcT0.Add(-time.Hour), NotAfter: lcT0.Add(lcRootTTL)})
}

// lcRenewal is an intermediate under root renewed from the self
// upstream, valid from at for 72 hours.
func lcRenewal(t *testing.T, root *testca.CA, name string, at time.Time) *keymgr.AuthorityRecord {
	t.Helper()
	issuing := root.NewIntermediate(t, name, testca.Options{NotBefore: at.Add(-2 * time.Minute), NotAfter: at.Add(72 * time.Hour)})
	return &keymgr.AuthorityRecord{Root: root.Cert, Cert: issuing.Cert, Key: issuing.Key, RootKey: root.Key,
		Upstream: upstream.Ref{Type: "self"}, Generated: true}
}

func TestRenewActive(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	root := lcSelfRoot(t, "self root")
	s := &keymgr.State{}
	first := lcRenewal(t, root, "intermediate 1", lcT0)
	if err := s.Bootstrap(first, lcT0, "generated on first start"); err != nil {
		t.Fatal(err)
	}
	s.RecordIssued(first.ID(), h(24*time.Hour), 24*time.Hour)
	seq := s.Sequence

	// An hour later, long before a new root could become active (half
	// the leaves' life), the renewal signs at once.
	second := lcRenewal(t, root, "intermediate 2", h(time.Hour))
	if err := s.Renew(first.ID(), second, h(time.Hour), "half of its life left"); err != nil {
		t.Fatal(err)
	}
	switch {
	case s.Active() != second || first.Phase != keymgr.PhasePrevious:
		t.Fatalf("active %.16s, first %s; want the renewal active and the first previous", s.Active().ID(), first.Phase)
	case s.Sequence != seq:
		t.Fatalf("sequence %d, want %d: the bundle did not change", s.Sequence, seq)
	case len(second.History) != 2 || second.History[0].To != keymgr.PhasePrepared || second.History[1].To != keymgr.PhaseActive:
		t.Fatalf("history %+v, want prepared and activated at once", second.History)
	case first.Key == nil || first.RootKey == nil:
		t.Fatal("the previous intermediate lost a key: it still stands for leaves that live")
	}
	lcBundleIs(t, s, root.Cert)
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}

	other := lcSelfRoot(t, "another root")
	tests := []struct {
		name string
		id   string
		rec  *keymgr.AuthorityRecord
		want string
	}{
		{"a previous authority", first.ID(), lcRenewal(t, root, "x", h(2*time.Hour)), "the authority is previous: only an active or a prepared one is renewed"},
		{"under another root", second.ID(), lcRenewal(t, other, "y", h(2*time.Hour)), "not under the authority's root"},
		{"without an upstream", second.ID(), func() *keymgr.AuthorityRecord {
			r := lcRenewal(t, root, "z", h(2*time.Hour))
			r.Upstream, r.RootKey = upstream.Ref{}, nil
			return r
		}(), "names no upstream"},
		{"with the same key", second.ID(), &keymgr.AuthorityRecord{Root: root.Cert, Cert: second.Cert, Key: second.Key, Upstream: second.Upstream}, "already in the state"},
		{"signing with the root", second.ID(), &keymgr.AuthorityRecord{Root: root.Cert, Cert: root.Cert, Key: root.Key, Upstream: second.Upstream}, "signs with an intermediate, not with its root"},
		{"with another root's key", second.ID(), func() *keymgr.AuthorityRecord {
			r := lcRenewal(t, root, "w", h(2*time.Hour))
			r.RootKey = other.Key
			return r
		}(), "the root key does not match the root certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := s.Clone()
			lcCheckErr(t, c.Renew(tt.id, tt.rec, h(2*time.Hour), ""), false, tt.want)
		})
	}
}

// TestRenewPrepared: the intermediate of a root being rotated in nears
// its end before the root may sign. Its renewal replaces it, prepared,
// and the activation guard still counts from when the root entered the
// bundle, not from the renewal.
func TestRenewPrepared(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	s, _ := lcBootstrapped(t)
	s.RecordIssued(s.Active().ID(), h(24*time.Hour), 24*time.Hour)
	next := lcSelfRoot(t, "next root")
	first := lcRenewal(t, next, "next intermediate 1", h(time.Hour))
	if err := s.Prepare(first, h(time.Hour), "next root"); err != nil {
		t.Fatal(err)
	}
	safeAt := s.View().NextStep(h(time.Hour), keymgr.DefaultGuards()).SafeAt
	second := lcRenewal(t, next, "next intermediate 2", h(5*time.Hour))
	if err := s.Renew(first.ID(), second, h(5*time.Hour), "renewed"); err != nil {
		t.Fatal(err)
	}
	switch {
	case first.Phase != keymgr.PhaseRetired || first.Key != nil || first.RootKey != nil:
		t.Fatalf("the replaced intermediate is %s with keys %v, %v; want retired, its keys destroyed", first.Phase, first.Key != nil, first.RootKey != nil)
	case second.Phase != keymgr.PhasePrepared || second.RootKey == nil:
		t.Fatalf("the renewal is %s, want prepared with the root's key", second.Phase)
	}
	st := s.View().NextStep(h(5*time.Hour), keymgr.DefaultGuards())
	if st.Verb != keymgr.VerbActivate || st.ID != second.ID() || !st.SafeAt.Equal(safeAt) {
		t.Fatalf("next step %+v, want to activate the renewal at %s, as its root entered the bundle at lcT0+1h", st, safeAt)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := s.Activate(second.ID(), safeAt, keymgr.DefaultGuards(), false, ""); err != nil {
		t.Fatal(err)
	}
}

func TestPruneRenewed(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	root := lcSelfRoot(t, "self root")
	s := &keymgr.State{}
	cur := lcRenewal(t, root, "intermediate 0", lcT0)
	if err := s.Bootstrap(cur, lcT0, ""); err != nil {
		t.Fatal(err)
	}
	g := keymgr.Guards{}
	for i := 1; i <= 14; i++ {
		at := h(time.Duration(i) * 36 * time.Hour)
		s.RecordIssued(cur.ID(), at.Add(24*time.Hour), 24*time.Hour)
		next := lcRenewal(t, root, "intermediate", at)
		if err := s.Renew(cur.ID(), next, at, ""); err != nil {
			t.Fatal(err)
		}
		if err := s.Retire(cur.ID(), at.Add(25*time.Hour), g, false, ""); err != nil {
			t.Fatal(err)
		}
		cur = next
	}
	if got := len(s.Authorities); got != 15 {
		t.Fatalf("%d authorities, want 15", got)
	}
	first := s.Authorities[0]
	lineage := s.View().Lineage()
	// An old one retired by force: its leaves still live.
	s.Authorities[2].LatestLeafNotAfter = h(10000 * time.Hour)
	if n := s.PruneRenewed(h(14*36*time.Hour+26*time.Hour), 8); n != 4 {
		t.Fatalf("pruned %d, want 4: of 14 retired, the first is kept (the lineage), the 8 newest, and one whose leaves live", n)
	}
	switch {
	case s.Authorities[0] != first || s.View().Lineage() != lineage:
		t.Fatal("pruning dropped the first authority: the lineage changed")
	case len(s.Authorities) != 11:
		t.Fatalf("%d authorities left, want 11", len(s.Authorities))
	case s.Active() != cur:
		t.Fatal("pruning took the active authority")
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if n := s.PruneRenewed(h(20000*time.Hour), 8); n != 1 {
		t.Fatalf("pruned %d once every leaf expired, want 1", n)
	}
}

// TestDueRenewedRoot: automatic rotation prepares the next root from the
// root's life, not from the intermediate's, which the renewer keeps; an
// intermediate renewed under the active root holds no root rotation
// back.
func TestDueRenewedRoot(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	root := lcSelfRoot(t, "self root")
	s := &keymgr.State{}
	first := lcRenewal(t, root, "intermediate 1", lcT0)
	if err := s.Bootstrap(first, lcT0, ""); err != nil {
		t.Fatal(err)
	}
	if st, due := s.View().Due(h(60*time.Hour), keymgr.DefaultGuards(), keymgr.AutoPolicy{}); due {
		t.Fatalf("due %+v at 60h: the intermediate nears its end, the root does not", st)
	}
	second := lcRenewal(t, root, "intermediate 2", h(36*time.Hour))
	if err := s.Renew(first.ID(), second, h(36*time.Hour), ""); err != nil {
		t.Fatal(err)
	}
	s.RecordIssued(first.ID(), h(59*24*time.Hour), 24*time.Hour)
	st, due := s.View().Due(h(61*24*time.Hour), keymgr.Guards{}, keymgr.AutoPolicy{})
	if !due || st.Verb != keymgr.VerbRetire || st.ID != first.ID() {
		t.Fatalf("due %+v, %v; want to retire the previous intermediate first", st, due)
	}
	if err := s.Retire(first.ID(), h(61*24*time.Hour), keymgr.Guards{}, false, ""); err != nil {
		t.Fatal(err)
	}
	s.RecordIssued(second.ID(), h(62*24*time.Hour), 24*time.Hour)
	if st, due := s.View().Due(h(61*24*time.Hour), keymgr.Guards{}, keymgr.AutoPolicy{}); !due || st.Verb != keymgr.VerbPrepare {
		t.Fatalf("due %+v, %v at 61 of the root's 90 days; want to prepare the next root", st, due)
	}
}

// TestRetireRenewalKeepsSequence: retiring an intermediate whose root
// another authority keeps changes no bundle, nor its sequence; retiring
// the last authority of a root does.
func TestRetireRenewalKeepsSequence(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	s, a, b := lcRotated(t)
	// b signs with its root: take it over, as self does, then retire
	// what it replaced.
	over := lcRenewal(t, &testca.CA{Cert: b.Root, Key: b.Key}, "takeover", h(15*time.Hour))
	over.RootKey = b.Key
	if err := s.Renew(b.ID(), over, h(15*time.Hour), ""); err != nil {
		t.Fatal(err)
	}
	seq := s.Sequence
	if err := s.Retire(b.ID(), h(16*time.Hour), keymgr.Guards{}, false, ""); err != nil {
		t.Fatal(err)
	}
	if s.Sequence != seq {
		t.Fatalf("sequence %d after retiring an authority whose root stays, want %d", s.Sequence, seq)
	}
	if err := s.Retire(a.ID(), h(25*time.Hour), keymgr.Guards{}, false, ""); err != nil {
		t.Fatal(err)
	}
	if s.Sequence != seq+1 {
		t.Fatalf("sequence %d after a root left the bundle, want %d", s.Sequence, seq+1)
	}
}
