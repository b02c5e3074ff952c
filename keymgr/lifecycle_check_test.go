package keymgr_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
)

// lcAllPhases returns a state with an authority in each phase, oldest
// first: retired, previous, active, prepared.
func lcAllPhases(t *testing.T) *keymgr.State {
	t.Helper()
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	s, _, _ := lcRotated(t)
	c := lcGenerated(t)
	steps := []error{
		s.Prepare(c, h(15*time.Hour), "third"),
		s.Retire(s.Authorities[0].ID(), h(24*time.Hour), keymgr.Guards{}, false, ""),
		s.Activate(c.ID(), h(28*time.Hour), keymgr.DefaultGuards(), false, ""),
		s.Prepare(lcImported(t), h(29*time.Hour), "fourth"),
	}
	for _, err := range steps {
		if err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestValidate(t *testing.T) {
	// The authorities of lcAllPhases, by index.
	const (
		retired = iota
		previous
		active
		prepared
	)
	tests := []struct {
		name   string
		state  func(t *testing.T) *keymgr.State
		mutate func(s *keymgr.State, a []*keymgr.AuthorityRecord)
		want   string
	}{
		{name: "empty", state: func(*testing.T) *keymgr.State { return &keymgr.State{} }},
		{name: "bootstrapped", state: func(t *testing.T) *keymgr.State { s, _ := lcBootstrapped(t); return s }},
		{name: "every phase"},
		{name: "external without a key", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) {
			a[prepared].External, a[prepared].Key = true, nil
		}},
		{name: "a nil authority", mutate: func(s *keymgr.State, _ []*keymgr.AuthorityRecord) {
			s.Authorities = append(s.Authorities, nil)
		}, want: "keymgr: validate: authority 5 has no root certificate"},
		{name: "no root", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) { a[previous].Root = nil },
			want: "keymgr: validate: authority 2 has no root certificate"},
		{name: "no signing certificate", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) { a[active].Cert = nil },
			want: "the authority has no signing certificate"},
		{name: "unknown phase", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) { a[prepared].Phase = "paused" },
			want: `unknown phase "paused"`},
		{name: "no history", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) { a[prepared].History = nil },
			want: "the authority has no history"},
		{name: "history ends elsewhere", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) {
			a[previous].Phase = keymgr.PhaseRetired
			a[previous].Key = nil
		},
			want: "the history ends in previous, the phase is retired"},
		{name: "history goes back", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) {
			a[previous].History = append(a[previous].History, keymgr.Transition{To: keymgr.PhaseActive}, keymgr.Transition{To: keymgr.PhasePrevious})
		}, want: "the history goes back to an earlier phase"},
		{name: "history repeats a phase", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) {
			a[prepared].History = append(a[prepared].History, keymgr.Transition{To: keymgr.PhasePrepared})
		}, want: "the history goes back to an earlier phase"},
		{name: "history with an unknown phase", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) {
			a[prepared].History = append([]keymgr.Transition{{To: "paused"}}, a[prepared].History...)
		}, want: "the history goes back to an earlier phase"},
		{name: "retired with its key", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) { a[retired].Key = a[active].Key },
			want: "a retired authority still has its key"},
		{name: "external with a key", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) { a[active].External = true },
			want: "an external authority holds a key"},
		{name: "no key", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) { a[previous].Key = nil },
			want: "the authority has no private key"},
		{name: "the wrong key", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) { a[active].Key = a[previous].Key },
			want: "the private key does not match the signing certificate's public key"},
		{name: "a signing certificate twice", mutate: func(s *keymgr.State, a []*keymgr.AuthorityRecord) {
			dup := *a[prepared]
			s.Authorities = append(s.Authorities, &dup)
		}, want: "the signing certificate appears twice"},
		{name: "two active", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) {
			a[prepared].Phase = keymgr.PhaseActive
			a[prepared].History = append(a[prepared].History, keymgr.Transition{To: keymgr.PhaseActive})
		}, want: "keymgr: validate: 2 authorities are active, want exactly one"},
		{name: "none active", mutate: func(_ *keymgr.State, a []*keymgr.AuthorityRecord) {
			a[active].Phase = keymgr.PhasePrevious
			a[active].History = append(a[active].History, keymgr.Transition{To: keymgr.PhasePrevious})
		}, want: "keymgr: validate: 0 authorities are active, want exactly one"},
		{name: "sequence zero", mutate: func(s *keymgr.State, _ []*keymgr.AuthorityRecord) { s.Sequence = 0 },
			want: "keymgr: validate: the bundle sequence is 0 although there are authorities"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := tt.state
			if state == nil {
				state = lcAllPhases
			}
			s := state(t)
			if tt.mutate != nil {
				tt.mutate(s, append([]*keymgr.AuthorityRecord(nil), s.Authorities...))
			}
			lcCheckErr(t, s.Validate(), false, tt.want)
		})
	}
}

func TestClone(t *testing.T) {
	s := lcAllPhases(t)
	c := s.Clone()
	if !reflect.DeepEqual(c, s) {
		t.Fatal("the clone differs from the original")
	}
	for i := range s.Authorities {
		if c.Authorities[i] == s.Authorities[i] {
			t.Fatal("the clone shares a record with the original")
		}
	}
	want := lcSnapshot(s)
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	prev, act, prep := c.Authorities[1], c.Authorities[2], c.Authorities[3]
	prep.Chain[0] = act.Root
	act.History[0].Reason = "rewritten"
	c.RecordIssued(act.ID(), h(1000*time.Hour), 100*time.Hour)
	steps := []error{
		c.Retire(prev.ID(), h(52*time.Hour), keymgr.Guards{}, false, ""),
		c.Activate(prep.ID(), h(90*time.Hour), keymgr.DefaultGuards(), false, ""),
		c.Prepare(lcGenerated(t), h(91*time.Hour), ""),
	}
	for _, err := range steps {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := lcSnapshot(s); got != want {
		t.Fatalf("changing the clone changed the original:\n got %s\nwant %s", got, want)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}

	withNil := &keymgr.State{Authorities: []*keymgr.AuthorityRecord{nil}}
	if c := withNil.Clone(); len(c.Authorities) != 1 || c.Authorities[0] != nil {
		t.Fatal("a nil record did not clone as nil")
	}
}

// lcSnapshot renders what a step may change in s.
func lcSnapshot(s *keymgr.State) string {
	out := fmt.Sprint(s.Sequence, len(s.Authorities))
	for _, a := range s.Authorities {
		out += fmt.Sprint(a.Phase, a.Key != nil, a.LatestLeafNotAfter, a.LongestLeafTTL, a.History)
		for _, c := range a.Chain {
			out += keymgr.Fingerprint(c)
		}
	}
	return out
}
