package keymgr_test

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
)

// lcCollidingRecords returns two records whose ids share their first
// keymgr.MinIDPrefix hex digits. Only the raw bytes of their signing
// certificates, which are their roots, are set: enough for Lookup, which
// reads nothing else.
func lcCollidingRecords(t *testing.T) (a, b *keymgr.AuthorityRecord) {
	t.Helper()
	seen := make(map[uint32][]byte)
	for i := uint64(0); i < 1<<24; i++ {
		raw := binary.BigEndian.AppendUint64(nil, i)
		sum := sha256.Sum256(raw)
		k := binary.BigEndian.Uint32(sum[:4])
		if prev, ok := seen[k]; ok {
			a, b := &x509.Certificate{Raw: prev}, &x509.Certificate{Raw: raw}
			return &keymgr.AuthorityRecord{Root: a, Cert: a}, &keymgr.AuthorityRecord{Root: b, Cert: b}
		}
		seen[k] = raw
	}
	t.Fatal("no colliding prefix found")
	return nil, nil
}

func TestLookup(t *testing.T) {
	s, a, b := lcRotating(t)
	x, y := lcCollidingRecords(t)
	s.Authorities = append(s.Authorities, x, y)
	flip := map[byte]byte{'0': '1'}
	unknown := []byte(a.ID()[:12])
	if f, ok := flip[unknown[0]]; ok {
		unknown[0] = f
	} else {
		unknown[0] = '0'
	}
	tests := []struct {
		name string
		id   string
		want *keymgr.AuthorityRecord
		err  string
	}{
		{"full id", a.ID(), a, ""},
		{"shortest prefix", b.ID()[:keymgr.MinIDPrefix], b, ""},
		{"upper case and spaces", " " + strings.ToUpper(b.ID()[:20]) + "\n", b, ""},
		{"prefix too short", a.ID()[:keymgr.MinIDPrefix-1], nil, "keymgr: lookup " + a.ID()[:7] + ": an id needs at least 8 hex digits"},
		{"not hex", "0123456z", nil, "keymgr: lookup 0123456z: an id is hex digits (the SHA-256 fingerprint of the authority's signing certificate)"},
		{"unknown", string(unknown), nil, "keymgr: lookup " + string(unknown) + ": no authority has this id"},
		{"ambiguous", x.ID()[:keymgr.MinIDPrefix], nil, "more than one authority has an id starting so: give more digits"},
		{"ambiguous prefix, full id", y.ID(), y, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.View().Lookup(tt.id)
			lcCheckErr(t, err, false, tt.err)
			if got != tt.want {
				t.Fatalf("Lookup(%q) = %v, want %v", tt.id, got, tt.want)
			}
		})
	}
}

func TestBundle(t *testing.T) {
	s, a, b := lcRotated(t)
	imported := lcImported(t)
	if err := s.Prepare(imported, lcT0.Add(15*time.Hour), "plugged-in root"); err != nil {
		t.Fatal(err)
	}
	want := []*x509.Certificate{a.Root, b.Root, imported.Root}
	if got := s.Bundle(); !reflect.DeepEqual(got, want) {
		t.Fatalf("bundle of previous, active, prepared: %d roots, want them in the order they were added", len(got))
	}
	if err := s.Retire(a.ID(), lcT0.Add(24*time.Hour), keymgr.Guards{}, false, ""); err != nil {
		t.Fatal(err)
	}
	want = want[1:]
	if got := s.Bundle(); !reflect.DeepEqual(got, want) {
		t.Fatal("a retired root is still in the bundle")
	}
	if got := (&keymgr.State{}).Bundle(); len(got) != 0 {
		t.Fatal("an empty state has a bundle")
	}
}

// lcPrepareAt is when the automatic threshold p of r's lifetime is
// reached.
func lcPrepareAt(r *keymgr.AuthorityRecord, p float64) time.Time {
	life := r.Cert.NotAfter.Sub(r.Cert.NotBefore)
	return r.Cert.NotAfter.Add(-time.Duration(p * float64(life)))
}

func TestNextStep(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	tests := []struct {
		name  string
		setup func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord)
		now   time.Time
		verb  string
		// safeAt of the step; for prepare, computed from the record.
		safeAt time.Time
		why    string
	}{
		{name: "no authority", setup: func(*testing.T) (*keymgr.State, *keymgr.AuthorityRecord) { return &keymgr.State{}, nil },
			why: "the state has no authority yet: the server bootstraps one on its first start"},
		{name: "a generated active authority", setup: lcBootstrapped, verb: keymgr.VerbPrepare,
			why: "33% of the lifetime of the active authority"},
		{name: "an imported active authority", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
			s := &keymgr.State{}
			a := lcImported(t)
			if err := s.Bootstrap(a, lcT0, "plugged in"); err != nil {
				t.Fatal(err)
			}
			return s, a
		}, verb: keymgr.VerbPrepare, why: "the active authority was imported, so this is up to an operator"},
		{name: "a prepared authority", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
			s, _, b := lcRotating(t)
			return s, b
		}, verb: keymgr.VerbActivate, safeAt: h(13*time.Hour + 5*time.Minute), why: "its root entered the bundle at 2030-01-01T01:00:00Z"},
		{name: "a previous authority", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
			s, a, _ := lcRotated(t)
			return s, a
		}, now: h(20 * time.Hour), verb: keymgr.VerbRetire, safeAt: h(24*time.Hour + keymgr.DefaultGuardMargin),
			why: "leaves issued under it can be valid until 2030-01-02T00:00:00Z (and 5m0s more for clocks that disagree)"},
		{name: "a previous authority whose leaves expired", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
			s, a, _ := lcRotated(t)
			return s, a
		}, now: h(25 * time.Hour), verb: keymgr.VerbRetire, safeAt: h(24*time.Hour + keymgr.DefaultGuardMargin), why: "every leaf issued under it has expired"},
		{name: "a previous authority without leaves", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
			s, a := lcBootstrapped(t)
			b := lcGenerated(t)
			if err := s.Prepare(b, h(time.Hour), ""); err != nil {
				t.Fatal(err)
			}
			if err := s.Activate(b.ID(), h(2*time.Hour), keymgr.DefaultGuards(), false, ""); err != nil {
				t.Fatal(err)
			}
			return s, a
		}, now: h(3 * time.Hour), verb: keymgr.VerbRetire, why: "no leaf was issued under it"},
		{name: "prepared before previous", setup: func(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
			s, _, _ := lcRotated(t)
			c := lcGenerated(t)
			if err := s.Prepare(c, h(15*time.Hour), ""); err != nil {
				t.Fatal(err)
			}
			return s, c
		}, verb: keymgr.VerbActivate, safeAt: h(27*time.Hour + 5*time.Minute), why: "longest leaf lifetime (24h0m0s) plus a margin (5m0s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, rec := tt.setup(t)
			got := s.View().NextStep(tt.now, keymgr.DefaultGuards())
			var wantID string
			if rec != nil && tt.verb != keymgr.VerbPrepare {
				wantID = rec.ID()
			}
			if tt.verb == keymgr.VerbPrepare {
				tt.safeAt = lcPrepareAt(rec, keymgr.DefaultPrepareAt)
			}
			switch {
			case got.Verb != tt.verb || got.ID != wantID:
				t.Errorf("step %s %.16s, want %s %.16s", got.Verb, got.ID, tt.verb, wantID)
			case !got.SafeAt.Equal(tt.safeAt):
				t.Errorf("safe at %s, want %s", got.SafeAt, tt.safeAt)
			case !strings.Contains(got.Why, tt.why):
				t.Errorf("why %q, want it to contain %q", got.Why, tt.why)
			}
		})
	}
}

// TestNextStepSafeAt walks three rotations doing each next step exactly
// at its SafeAt: a nanosecond earlier the guard refuses it, at SafeAt it
// is done.
func TestNextStepSafeAt(t *testing.T) {
	s, a := lcBootstrapped(t)
	now := lcT0
	g := keymgr.DefaultGuards()
	issue := func(at time.Time) {
		act := s.Active()
		_, notAfter := certs.Window(certs.WindowOptions{Now: at, TTL: 24 * time.Hour}, act.Cert, act.Chain...)
		s.RecordIssued(act.ID(), notAfter, 24*time.Hour)
	}
	var steps []string
	for len(steps) < 9 {
		issue(now)
		st := s.View().NextStep(now, g)
		if st.SafeAt.After(now) {
			now = st.SafeAt
		}
		issue(now)
		// Issuing at the new now may move a guard: ask again.
		if st = s.View().NextStep(now, g); st.SafeAt.After(now) {
			t.Fatalf("%s became safe later after issuing: %s", st.Verb, st.SafeAt)
		}
		seq := s.Sequence
		var err error
		switch st.Verb {
		case keymgr.VerbPrepare:
			r, rerr := keymgr.NewRoot(keymgr.RootOptions{TTL: lcRootTTL, Now: now})
			if rerr != nil {
				t.Fatal(rerr)
			}
			err = s.Prepare(&keymgr.AuthorityRecord{Root: r.Cert, Cert: r.Cert, Key: r.Key, Generated: true}, now, "auto")
		case keymgr.VerbActivate:
			if early := s.Activate(st.ID, now.Add(-1), g, false, ""); early == nil {
				t.Fatal("activate a nanosecond before SafeAt was not refused")
			}
			err = s.Activate(st.ID, now, g, false, "")
		case keymgr.VerbRetire:
			if early := s.Retire(st.ID, now.Add(-1), g, false, ""); early == nil {
				t.Fatal("retire a nanosecond before SafeAt was not refused")
			}
			err = s.Retire(st.ID, now, g, false, "")
		default:
			t.Fatalf("no next step: %s", st.Why)
		}
		if err != nil {
			t.Fatalf("%s at its SafeAt: %v", st.Verb, err)
		}
		if s.Sequence != seq+1 {
			t.Fatalf("sequence %d after %s, want %d", s.Sequence, st.Verb, seq+1)
		}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		steps = append(steps, st.Verb)
	}
	want := "prepare activate retire prepare activate retire prepare activate retire"
	if got := strings.Join(steps, " "); got != want {
		t.Fatalf("steps %s, want %s", got, want)
	}
	if a.Phase != keymgr.PhaseRetired || len(s.Bundle()) != 1 {
		t.Fatal("after three rotations the first authority is not retired or the bundle has more than one root")
	}
}

func TestRecordIssued(t *testing.T) {
	base := lcT0.Add(24 * time.Hour)
	tests := []struct {
		name     string
		id       func(a *keymgr.AuthorityRecord) string
		notAfter time.Time
		ttl      time.Duration
		changed  bool
		// wantNotAfter and wantTTL are what the authority holds after.
		wantNotAfter time.Time
		wantTTL      time.Duration
	}{
		{"both grow", nil, base.Add(time.Hour), 25 * time.Hour, true, base.Add(time.Hour), 25 * time.Hour},
		{"the same", nil, base, 24 * time.Hour, false, base, 24 * time.Hour},
		{"shorter", nil, base.Add(-time.Hour), time.Hour, false, base, 24 * time.Hour},
		{"only later", nil, base.Add(time.Minute), time.Hour, true, base.Add(time.Minute), 24 * time.Hour},
		{"only longer", nil, base, 48 * time.Hour, true, base, 48 * time.Hour},
		{"a prefix is not an id", func(a *keymgr.AuthorityRecord) string { return a.ID()[:16] }, base.Add(time.Hour), 48 * time.Hour, false, base, 24 * time.Hour},
		{"unknown id", func(*keymgr.AuthorityRecord) string { return strings.Repeat("0", 64) }, base.Add(time.Hour), 48 * time.Hour, false, base, 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, a := lcBootstrapped(t)
			if !s.RecordIssued(a.ID(), base, 24*time.Hour) {
				t.Fatal("the first leaf changed nothing")
			}
			id := a.ID()
			if tt.id != nil {
				id = tt.id(a)
			}
			seq := s.Sequence
			if got := s.RecordIssued(id, tt.notAfter, tt.ttl); got != tt.changed {
				t.Errorf("changed = %v, want %v", got, tt.changed)
			}
			switch {
			case !a.LatestLeafNotAfter.Equal(tt.wantNotAfter) || a.LongestLeafTTL != tt.wantTTL:
				t.Errorf("latest %s longest %s, want %s %s", a.LatestLeafNotAfter, a.LongestLeafTTL, tt.wantNotAfter, tt.wantTTL)
			case s.Sequence != seq:
				t.Error("recording a leaf changed the bundle sequence")
			}
		})
	}
}
