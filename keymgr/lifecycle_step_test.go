package keymgr_test

import (
	"errors"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
)

// lcWantGuard checks the fields of the *GuardError in err.
func lcWantGuard(t *testing.T, err error, verb, id string, safeAt, now time.Time) {
	t.Helper()
	var ge *keymgr.GuardError
	if !errors.As(err, &ge) {
		t.Fatalf("err = %v, want a *GuardError", err)
	}
	if ge.Verb != verb || ge.ID != id || !ge.SafeAt.Equal(safeAt) || !ge.Now.Equal(now) {
		t.Fatalf("GuardError{%s %s SafeAt %s Now %s}, want {%s %s SafeAt %s Now %s}",
			ge.Verb, ge.ID, ge.SafeAt, ge.Now, verb, id, safeAt, now)
	}
}

func TestActivate(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	guardMsg := func(ttl, margin, safeAt, in string) string {
		return "refused: its root entered the bundle at 2030-01-01T01:00:00Z and workloads learn it only when they renew, " +
			"at half their leaf's life: it must be served for half the longest leaf lifetime (" + ttl + ") plus a margin (" + margin + "); " +
			"safe at " + safeAt + " (in " + in + ")"
	}
	tests := []struct {
		name string
		// setup returns the state, the authority asked for and the one
		// active before the step.
		setup  func(t *testing.T) (s *keymgr.State, target, active *keymgr.AuthorityRecord)
		id     func(target *keymgr.AuthorityRecord) string
		now    time.Time
		g      keymgr.Guards
		force  bool
		reason string
		// guardAt is the SafeAt of a guard's refusal; want is in the
		// refusal's message.
		guardAt time.Time
		want    string
	}{
		{name: "at the guard", setup: lcRotatingTarget, now: h(13*time.Hour + 5*time.Minute), g: keymgr.DefaultGuards(), reason: "rotate"},
		{name: "after the guard by prefix", setup: lcRotatingTarget, id: func(r *keymgr.AuthorityRecord) string { return r.ID()[:8] },
			now: h(20 * time.Hour), g: keymgr.DefaultGuards()},
		{name: "before the guard", setup: lcRotatingTarget, now: h(2 * time.Hour), g: keymgr.DefaultGuards(),
			guardAt: h(13*time.Hour + 5*time.Minute), want: guardMsg("24h0m0s", "5m0s", "2030-01-01T13:05:00Z", "11h5m0s")},
		{name: "a second before the guard", setup: lcRotatingTarget, now: h(13*time.Hour + 5*time.Minute - time.Second), g: keymgr.DefaultGuards(),
			guardAt: h(13*time.Hour + 5*time.Minute), want: "safe at 2030-01-01T13:05:00Z (in 1s)"},
		{name: "zero margin", setup: lcRotatingTarget, now: h(13 * time.Hour)},
		{name: "zero margin, a nanosecond early", setup: lcRotatingTarget, now: h(13*time.Hour - 1),
			guardAt: h(13 * time.Hour), want: guardMsg("24h0m0s", "0s", "2030-01-01T13:00:00Z", "1s")},
		{name: "a negative margin counts as zero", setup: lcRotatingTarget, now: h(12 * time.Hour), g: keymgr.Guards{Margin: -time.Hour},
			guardAt: h(13 * time.Hour), want: guardMsg("24h0m0s", "0s", "2030-01-01T13:00:00Z", "1h0m0s")},
		{name: "a fractional safe time rounds up", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord, *keymgr.AuthorityRecord) {
			s, a, b := lcRotating(t)
			s.RecordIssued(a.ID(), h(24*time.Hour), 24*time.Hour+time.Second)
			return s, b, a
		}, now: h(13*time.Hour + 5*time.Minute), g: keymgr.DefaultGuards(),
			guardAt: h(13*time.Hour + 5*time.Minute + 500*time.Millisecond), want: guardMsg("24h0m1s", "5m0s", "2030-01-01T13:05:01Z", "1s")},
		{name: "no leaf issued yet", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord, *keymgr.AuthorityRecord) {
			s, a := lcBootstrapped(t)
			b := lcGenerated(t)
			if err := s.Prepare(b, h(time.Hour), ""); err != nil {
				t.Fatal(err)
			}
			return s, b, a
		}, now: h(time.Hour + 4*time.Minute), g: keymgr.DefaultGuards(),
			guardAt: h(time.Hour + 5*time.Minute), want: guardMsg("0s", "5m0s", "2030-01-01T01:05:00Z", "1m0s")},
		{name: "a previous authority's leaves count", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord, *keymgr.AuthorityRecord) {
			s, _, b := lcRotated(t)
			c := lcGenerated(t)
			if err := s.Prepare(c, h(15*time.Hour), ""); err != nil {
				t.Fatal(err)
			}
			return s, c, b
		}, now: h(16 * time.Hour), g: keymgr.DefaultGuards(),
			guardAt: h(27*time.Hour + 5*time.Minute), want: "longest leaf lifetime (24h0m0s)"},
		{name: "forced early", setup: lcRotatingTarget, now: h(2 * time.Hour), g: keymgr.DefaultGuards(), force: true, reason: "incident 42"},
		{name: "forced without a reason", setup: lcRotatingTarget, now: h(2 * time.Hour), force: true,
			want: "a forced step needs a reason, recorded in the history"},
		{name: "forced with a blank reason", setup: lcRotatingTarget, now: h(20 * time.Hour), force: true, reason: " \t",
			want: "a forced step needs a reason, recorded in the history"},
		{name: "unknown id", setup: lcRotatingTarget, id: func(*keymgr.AuthorityRecord) string { return "deadbeefdeadbeef" },
			now: h(20 * time.Hour), want: "keymgr: activate deadbeefdeadbeef: no authority has this id"},
		{name: "the active authority", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord, *keymgr.AuthorityRecord) {
			s, a, _ := lcRotating(t)
			return s, a, a
		}, now: h(20 * time.Hour), want: "the authority is active, not prepared"},
		{name: "an expired prepared authority, even forced", setup: lcRotatingTarget, now: h(lcRootTTL), force: true, reason: "late",
			want: "expired at 2030-03-31T23:00:00Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, target, active := tt.setup(t)
			id := target.ID()
			if tt.id != nil {
				id = tt.id(target)
			}
			seq, phase := s.Sequence, target.Phase
			err := s.Activate(id, tt.now, tt.g, tt.force, tt.reason)
			lcCheckErr(t, err, !tt.guardAt.IsZero(), tt.want)
			if err != nil {
				if !tt.guardAt.IsZero() {
					lcWantGuard(t, err, keymgr.VerbActivate, target.ID(), tt.guardAt, tt.now)
				}
				if s.Sequence != seq || target.Phase != phase || s.Active() != active {
					t.Fatal("a refused activate changed the state")
				}
				return
			}
			old := keymgr.Transition{To: keymgr.PhasePrevious, At: tt.now, Reason: "superseded by " + target.ID()[:16], Forced: tt.force}
			if tt.reason != "" {
				old.Reason += ": " + tt.reason
			}
			act := keymgr.Transition{To: keymgr.PhaseActive, At: tt.now, Reason: tt.reason, Forced: tt.force}
			switch {
			case s.Sequence != seq+1:
				t.Errorf("sequence %d, want %d", s.Sequence, seq+1)
			case s.Active() != target || target.Phase != keymgr.PhaseActive:
				t.Error("the target is not active")
			case active.Phase != keymgr.PhasePrevious:
				t.Errorf("the old active authority is %s, want previous", active.Phase)
			case lcLast(target) != act:
				t.Errorf("target's last transition %+v, want %+v", lcLast(target), act)
			case lcLast(active) != old:
				t.Errorf("old active's last transition %+v, want %+v", lcLast(active), old)
			case len(s.Bundle()) != len(s.Authorities):
				t.Errorf("the bundle has %d roots, want %d", len(s.Bundle()), len(s.Authorities))
			}
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func lcRotatingTarget(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord, *keymgr.AuthorityRecord) {
	s, a, b := lcRotating(t)
	return s, b, a
}

func lcLast(r *keymgr.AuthorityRecord) keymgr.Transition { return r.History[len(r.History)-1] }

func TestRetire(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	tests := []struct {
		name   string
		target func(t *testing.T, s *keymgr.State, a, b *keymgr.AuthorityRecord) string
		now    time.Time
		g      keymgr.Guards
		force  bool
		reason string
		// guard: the refusal is a guard's, safe at lcT0+24h+safeAfter.
		guard     bool
		safeAfter time.Duration
		want      string
	}{
		{name: "when the last leaf expires", now: h(24 * time.Hour), reason: "rotation done"},
		{name: "later, by prefix", target: func(_ *testing.T, _ *keymgr.State, a, _ *keymgr.AuthorityRecord) string { return a.ID()[:10] },
			now: h(40 * time.Hour)},
		{name: "while leaves live", now: h(20 * time.Hour), guard: true,
			want: "refused: leaves issued under it can be valid until 2030-01-02T00:00:00Z, and workloads holding them need its root; " +
				"safe at 2030-01-02T00:00:00Z (in 4h0m0s)"},
		{name: "a nanosecond early", now: h(24*time.Hour - 1), guard: true, want: "safe at 2030-01-02T00:00:00Z (in 1s)"},
		{name: "within the margin after the last leaf", now: h(24*time.Hour + 30*time.Second), g: keymgr.Guards{Margin: time.Minute},
			guard: true, safeAfter: time.Minute,
			want: "can be valid until 2030-01-02T00:00:00Z (and 1m0s more for clocks that disagree), and workloads holding them " +
				"need its root; safe at 2030-01-02T00:01:00Z (in 30s)"},
		{name: "once the margin has passed", now: h(24*time.Hour + time.Minute), g: keymgr.Guards{Margin: time.Minute}},
		{name: "a negative margin counts as zero", now: h(24*time.Hour - 1), g: keymgr.Guards{Margin: -time.Hour}, guard: true,
			want: "safe at 2030-01-02T00:00:00Z (in 1s)"},
		{name: "forced within the margin", now: h(24 * time.Hour), g: keymgr.Guards{Margin: time.Hour}, force: true, reason: "clocks checked"},
		{name: "forced early", now: h(20 * time.Hour), force: true, reason: "key compromise"},
		{name: "forced without a reason", now: h(20 * time.Hour), force: true, want: "a forced step needs a reason"},
		{name: "the active authority", target: func(_ *testing.T, _ *keymgr.State, _, b *keymgr.AuthorityRecord) string { return b.ID() },
			now: h(40 * time.Hour), want: "the authority is active, not previous"},
		{name: "a prepared authority", target: func(t *testing.T, s *keymgr.State, _, _ *keymgr.AuthorityRecord) string {
			c := lcGenerated(t)
			if err := s.Prepare(c, h(15*time.Hour), ""); err != nil {
				t.Fatal(err)
			}
			return c.ID()
		}, now: h(40 * time.Hour), force: true, reason: "abort", want: "the authority is prepared, not previous"},
		{name: "already retired", target: func(t *testing.T, s *keymgr.State, a, _ *keymgr.AuthorityRecord) string {
			if err := s.Retire(a.ID(), h(30*time.Hour), keymgr.Guards{}, false, ""); err != nil {
				t.Fatal(err)
			}
			return a.ID()
		}, now: h(40 * time.Hour), want: "the authority is retired, not previous"},
		{name: "an id too short", target: func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord, *keymgr.AuthorityRecord) string { return "abc" },
			now: h(40 * time.Hour), want: "keymgr: retire abc: an id needs at least 8 hex digits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, a, b := lcRotated(t)
			id := a.ID()
			if tt.target != nil {
				id = tt.target(t, s, a, b)
			}
			seq, key, bundle := s.Sequence, a.Key, len(s.Bundle())
			err := s.Retire(id, tt.now, tt.g, tt.force, tt.reason)
			if tt.want == "" && tt.guard {
				t.Fatal("bad test")
			}
			lcCheckErr(t, err, tt.guard, tt.want)
			if tt.guard {
				lcWantGuard(t, err, keymgr.VerbRetire, a.ID(), h(24*time.Hour+tt.safeAfter), tt.now)
			}
			if err != nil {
				if s.Sequence != seq || len(s.Bundle()) != bundle || a.Key != key {
					t.Fatal("a refused retire changed the state")
				}
				return
			}
			want := keymgr.Transition{To: keymgr.PhaseRetired, At: tt.now, Reason: tt.reason, Forced: tt.force}
			switch {
			case a.Phase != keymgr.PhaseRetired || lcLast(a) != want:
				t.Errorf("phase %s, last transition %+v; want retired, %+v", a.Phase, lcLast(a), want)
			case a.Key != nil:
				t.Error("a retired authority kept its key")
			case s.Sequence != seq+1:
				t.Errorf("sequence %d, want %d", s.Sequence, seq+1)
			case len(s.Bundle()) != 1 || !s.Bundle()[0].Equal(b.Root):
				t.Error("the bundle is not the active root alone")
			}
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestErrorMessages(t *testing.T) {
	id := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	at := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"state error without an id", &keymgr.StateError{Verb: "prepare", Reason: "no root"}, "keymgr: prepare: no root"},
		{"state error with a long id", &keymgr.StateError{Verb: "activate", ID: id, Reason: "wrong phase"}, "keymgr: activate 0123456789abcdef: wrong phase"},
		{"state error with a short id", &keymgr.StateError{Verb: "lookup", ID: "01", Reason: "too short"}, "keymgr: lookup 01: too short"},
		{"guard error", &keymgr.GuardError{Verb: "retire", ID: id, Reason: "leaves live", SafeAt: at, Now: at.Add(-90 * time.Minute)},
			"keymgr: retire 0123456789abcdef refused: leaves live; safe at 2030-01-01T12:00:00Z (in 1h30m0s)"},
		{"guard error without now", &keymgr.GuardError{Verb: "retire", ID: id, Reason: "leaves live", SafeAt: at},
			"keymgr: retire 0123456789abcdef refused: leaves live; safe at 2030-01-01T12:00:00Z"},
		{"guard error rounds up", &keymgr.GuardError{Verb: "activate", ID: id, Reason: "wait", SafeAt: at.Add(time.Millisecond), Now: at.Add(-time.Second)},
			"keymgr: activate 0123456789abcdef refused: wait; safe at 2030-01-01T12:00:01Z (in 2s)"},
		{"guard error in another zone", &keymgr.GuardError{Verb: "activate", ID: id, Reason: "wait", SafeAt: at.In(time.FixedZone("X", 3600)), Now: at},
			"keymgr: activate 0123456789abcdef refused: wait; safe at 2030-01-01T12:00:00Z (in 0s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Fatalf("Error() = %q\nwant      %q", got, tt.want)
			}
		})
	}
}
