package keymgr_test

import (
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
)

func TestDue(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	g := keymgr.DefaultGuards()
	bootstrapped := func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) { return lcBootstrapped(t) }
	rotating := func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
		s, _, b := lcRotating(t)
		return s, b
	}
	rotated := func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
		s, a, _ := lcRotated(t)
		return s, a
	}
	// importedNext: the generated active authority a has an imported
	// authority prepared next to it.
	importedNext := func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
		s, a := lcBootstrapped(t)
		if err := s.Prepare(lcImported(t), h(time.Hour), "plugged in"); err != nil {
			t.Fatal(err)
		}
		return s, a
	}
	// importedPrevious: an imported authority became previous when a
	// generated one replaced it.
	importedPrevious := func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
		s := &keymgr.State{}
		a := lcImported(t)
		if err := s.Bootstrap(a, lcT0, "plugged in"); err != nil {
			t.Fatal(err)
		}
		b := lcGenerated(t)
		if err := s.Prepare(b, h(time.Hour), ""); err != nil {
			t.Fatal(err)
		}
		if err := s.Activate(b.ID(), h(2*time.Hour), g, false, ""); err != nil {
			t.Fatal(err)
		}
		return s, b
	}
	tests := []struct {
		name  string
		setup func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord)
		// now is when Due is asked; for prepare cases, at is an offset
		// from the threshold of p instead.
		now  func(r *keymgr.AuthorityRecord) time.Time
		p    keymgr.AutoPolicy
		verb string
		// id: the step names the record setup returned.
		id bool
	}{
		{name: "fresh root", setup: bootstrapped, now: lcAt(h(0))},
		{name: "before the threshold", setup: bootstrapped, now: lcThreshold(keymgr.DefaultPrepareAt, -1)},
		{name: "at the threshold", setup: bootstrapped, now: lcThreshold(keymgr.DefaultPrepareAt, 0), verb: keymgr.VerbPrepare},
		{name: "at half, policy one half", setup: bootstrapped, p: keymgr.AutoPolicy{PrepareAt: 0.5}, now: lcThreshold(0.5, 0), verb: keymgr.VerbPrepare},
		{name: "before half, policy one half", setup: bootstrapped, p: keymgr.AutoPolicy{PrepareAt: 0.5}, now: lcThreshold(0.5, -time.Second)},
		{name: "policy above one", setup: bootstrapped, p: keymgr.AutoPolicy{PrepareAt: 3}, now: lcAt(h(0)), verb: keymgr.VerbPrepare},
		{name: "expired root", setup: bootstrapped, now: lcAt(h(lcRootTTL)), verb: keymgr.VerbPrepare},
		{name: "imported active", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
			s := &keymgr.State{}
			a := lcImported(t)
			if err := s.Bootstrap(a, lcT0, ""); err != nil {
				t.Fatal(err)
			}
			return s, a
		}, now: lcThreshold(keymgr.DefaultPrepareAt, time.Hour)},
		{name: "prepared, guard refuses", setup: rotating, now: lcAt(h(13*time.Hour + 5*time.Minute - 1))},
		{name: "prepared, guard allows", setup: rotating, now: lcAt(h(13*time.Hour + 5*time.Minute)), verb: keymgr.VerbActivate, id: true},
		{name: "prepared, past the threshold", setup: rotating, now: lcThreshold(keymgr.DefaultPrepareAt, 0), verb: keymgr.VerbActivate, id: true},
		{name: "imported prepared, past both", setup: importedNext, now: lcThreshold(keymgr.DefaultPrepareAt, 0)},
		{name: "previous, leaves live", setup: rotated, now: lcAt(h(24*time.Hour - 1))},
		{name: "previous, leaves expired, within the margin", setup: rotated, now: lcAt(h(24*time.Hour + keymgr.DefaultGuardMargin - 1))},
		{name: "previous, leaves expired, past the margin", setup: rotated, now: lcAt(h(24*time.Hour + keymgr.DefaultGuardMargin)),
			verb: keymgr.VerbRetire, id: true},
		{name: "previous, leaves live, active at its threshold: one rotation at a time", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
			s, a, _ := lcRotated(t)
			a.LatestLeafNotAfter = lcT0.Add(lcRootTTL) // a leaf as long as the roots
			return s, a
		}, now: lcThreshold(keymgr.DefaultPrepareAt, time.Hour)},
		{name: "imported previous", setup: importedPrevious, now: lcAt(h(30 * 24 * time.Hour))},
		{name: "imported previous, generated active at its threshold", setup: importedPrevious, now: lcThreshold(keymgr.DefaultPrepareAt, 0), verb: keymgr.VerbPrepare},
		{name: "no authority", setup: func(*testing.T) (*keymgr.State, *keymgr.AuthorityRecord) { return &keymgr.State{}, nil }, now: lcAt(h(0))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, rec := tt.setup(t)
			now := tt.now(s.Active())
			st, due := s.View().Due(now, g, tt.p)
			if due != (tt.verb != "") || st.Verb != tt.verb {
				t.Fatalf("Due = %q %v (%s), want %q", st.Verb, due, st.Why, tt.verb)
			}
			if tt.id && st.ID != rec.ID() || !tt.id && st.ID != "" {
				t.Fatalf("step on %.16s, want it on %v", st.ID, tt.id)
			}
			if due && st.SafeAt.After(now) {
				t.Fatalf("a due step is safe only at %s, after %s", st.SafeAt, now)
			}
		})
	}
}

// lcAt is a Due test's clock that ignores the active authority.
func lcAt(t time.Time) func(*keymgr.AuthorityRecord) time.Time {
	return func(*keymgr.AuthorityRecord) time.Time { return t }
}

// lcThreshold is a Due test's clock at offset from when fraction p of
// the active authority's lifetime is left.
func lcThreshold(p float64, offset time.Duration) func(*keymgr.AuthorityRecord) time.Time {
	return func(a *keymgr.AuthorityRecord) time.Time { return lcPrepareAt(a, p).Add(offset) }
}

// lcWorkload is a simulated ztunnel: it holds the leaf of its last reply
// and trusts exactly the bundle of that reply.
type lcWorkload struct {
	issuer           string
	issued, notAfter time.Time
	trusts           map[string]bool
	renewals         int
}

// TestAutoRotationKeepsEveryHandshake runs automatic rotation over several
// root lifetimes on a fake clock while workloads renew at half their
// leaf's life, trusting only the bundle of their last reply, and checks
// every pair of workloads could handshake at every tick: each trusts the
// root of every other's live leaf.
func TestAutoRotationKeepsEveryHandshake(t *testing.T) {
	const (
		rootTTL  = 6 * 24 * time.Hour
		leafTTL  = 24 * time.Hour
		tick     = 10 * time.Minute
		fleet    = 12
		duration = 25 * 24 * time.Hour
	)
	g := keymgr.DefaultGuards()
	newRoot := func(now time.Time) *keymgr.AuthorityRecord {
		a, err := keymgr.NewRoot(keymgr.RootOptions{TTL: rootTTL, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		return &keymgr.AuthorityRecord{Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true}
	}
	s := &keymgr.State{}
	if err := s.Bootstrap(newRoot(lcT0), lcT0, "first start"); err != nil {
		t.Fatal(err)
	}
	renew := func(w *lcWorkload, now time.Time) {
		act := s.Active()
		_, notAfter := certs.Window(certs.WindowOptions{Now: now, TTL: leafTTL}, act.Cert, act.Chain...)
		s.RecordIssued(act.ID(), notAfter, leafTTL)
		w.issuer, w.issued, w.notAfter = act.ID(), now, notAfter
		w.trusts = map[string]bool{}
		for _, r := range s.Bundle() {
			w.trusts[keymgr.Fingerprint(r)] = true
		}
		w.renewals++
	}
	fleetOf := make([]*lcWorkload, fleet)
	for i := range fleetOf {
		fleetOf[i] = &lcWorkload{}
		renew(fleetOf[i], lcT0.Add(time.Duration(i)*leafTTL/fleet-leafTTL))
	}
	steps := map[string]int{}
	checks := 0
	for now := lcT0; now.Before(lcT0.Add(duration)); now = now.Add(tick) {
		for {
			st, due := s.View().Due(now, g, keymgr.AutoPolicy{})
			if !due {
				break
			}
			var err error
			switch st.Verb {
			case keymgr.VerbPrepare:
				err = s.Prepare(newRoot(now), now, "automatic: "+st.Why)
			case keymgr.VerbActivate:
				err = s.Activate(st.ID, now, g, false, "automatic")
			case keymgr.VerbRetire:
				err = s.Retire(st.ID, now, g, false, "automatic")
			}
			if err != nil {
				t.Fatalf("%s: due %s refused: %v", now, st.Verb, err)
			}
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			steps[st.Verb]++
		}
		for _, w := range fleetOf {
			if !now.Before(w.issued.Add(w.notAfter.Sub(w.issued) / 2)) {
				renew(w, now)
			}
		}
		for i, x := range fleetOf {
			for j, y := range fleetOf {
				if !now.Before(y.notAfter) {
					t.Fatalf("%s: workload %d holds an expired leaf", now, j)
				}
				if !x.trusts[y.issuer] {
					t.Fatalf("%s: workload %d does not trust the root of workload %d's leaf (%.16s); steps so far %v", now, i, j, y.issuer, steps)
				}
				checks++
			}
		}
	}
	if steps[keymgr.VerbRetire] < 3 {
		t.Fatalf("only %v steps in %s: the test did not rotate enough", steps, duration)
	}
	t.Logf("steps %v, %d handshake checks, sequence %d", steps, checks, s.Sequence)
}
