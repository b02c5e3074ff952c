package keymgr_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
)

// holdRenewed is a state whose first intermediate under a self root was
// renewed at lcT0+1h: the second is active, the first previous.
func holdRenewed(t *testing.T) (s *keymgr.State, root *testca.CA, first, second *keymgr.AuthorityRecord) {
	t.Helper()
	root = lcSelfRoot(t, "self root")
	s = &keymgr.State{}
	first = lcRenewal(t, root, "intermediate 1", lcT0)
	if err := s.Bootstrap(first, lcT0, "generated on first start"); err != nil {
		t.Fatal(err)
	}
	second = lcRenewal(t, root, "intermediate 2", lcT0.Add(time.Hour))
	if err := s.Renew(first.ID(), second, lcT0.Add(time.Hour), ""); err != nil {
		t.Fatal(err)
	}
	return s, root, first, second
}

// TestHeldAuthority: a renewed intermediate signs only hold after it was
// stored (with its first CRL); the one it replaced signs meanwhile, unless
// it cannot (expired, revoked, keyless), when the new one signs at once
// rather than none.
func TestHeldAuthority(t *testing.T) {
	renewedAt := lcT0.Add(time.Hour)
	hold := 2 * time.Minute
	tests := []struct {
		name      string
		edit      func(t *testing.T, s *keymgr.State, root *testca.CA, first *keymgr.AuthorityRecord)
		at        time.Time
		hold      time.Duration
		wantFirst bool // the replaced intermediate signs
	}{
		{"during the hold", nil, renewedAt.Add(time.Minute), hold, true},
		{"at the renewal", nil, renewedAt, hold, true},
		{"when the hold ends", nil, renewedAt.Add(hold), hold, false},
		{"after it", nil, renewedAt.Add(time.Hour), hold, false},
		{"without a hold", nil, renewedAt, 0, false},
		{"the replaced one revoked", func(t *testing.T, s *keymgr.State, root *testca.CA, first *keymgr.AuthorityRecord) {
			r := keymgr.Revocation{Serial: first.Cert.SerialNumber, Issuer: keymgr.Fingerprint(root.Cert), Reason: 1, RevokedAt: renewedAt,
				NotAfter: first.Cert.NotAfter, By: "test"}
			if n, err := s.Revoke([]keymgr.Revocation{r}, renewedAt); err != nil || n != 1 {
				t.Fatalf("Revoke = %d, %v", n, err)
			}
		}, renewedAt.Add(time.Minute), hold, false},
		{"the replaced one without its key", func(_ *testing.T, _ *keymgr.State, _ *testca.CA, first *keymgr.AuthorityRecord) {
			first.Key = nil
		}, renewedAt.Add(time.Minute), hold, false},
		{"the replaced one expired", nil, lcT0.Add(72*time.Hour + time.Second), 73 * time.Hour, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, root, first, second := holdRenewed(t)
			if tt.edit != nil {
				tt.edit(t, s, root, first)
			}
			a, until, err := keymgr.HeldAuthority(s, tt.at, tt.hold)
			if err != nil {
				t.Fatal(err)
			}
			want, wantUntil := second, time.Time{}
			if tt.wantFirst {
				want, wantUntil = first, renewedAt.Add(tt.hold)
			}
			if !a.Cert.Equal(want.Cert) || !until.Equal(wantUntil) {
				t.Fatalf("signs with %q until %v; want %q until %v", a.Cert.Subject.CommonName, until, want.Cert.Subject.CommonName, wantUntil)
			}
			if len(a.Roots) != 1 || !a.Roots[0].Equal(root.Cert) {
				t.Fatalf("trusts %d roots, want the state's one", len(a.Roots))
			}
		})
	}
}

// TestHeldAuthorityActivation: a root activated long after it was
// prepared signs at once (its CRL had time to travel); one whose
// intermediate was renewed, prepared, moments before the activation is
// held, the authority it replaced (under the old root) signing meanwhile.
func TestHeldAuthorityActivation(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	for _, late := range []bool{false, true} {
		s, _ := lcBootstrapped(t)
		old := s.Active()
		next := lcSelfRoot(t, "next root")
		prepared := lcRenewal(t, next, "next intermediate 1", h(time.Hour))
		if err := s.Prepare(prepared, h(time.Hour), "next root"); err != nil {
			t.Fatal(err)
		}
		activateAt := h(30 * time.Hour)
		if late {
			renewal := lcRenewal(t, next, "next intermediate 2", activateAt.Add(-time.Minute))
			if err := s.Renew(prepared.ID(), renewal, activateAt.Add(-time.Minute), ""); err != nil {
				t.Fatal(err)
			}
			prepared = renewal
		}
		if err := s.Activate(prepared.ID(), activateAt, keymgr.Guards{}, false, ""); err != nil {
			t.Fatal(err)
		}
		a, until, err := keymgr.HeldAuthority(s, activateAt, 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !late && (!a.Cert.Equal(prepared.Cert) || !until.IsZero()):
			t.Fatalf("prepared a day before: signs with %q until %v, want the activated one at once", a.Cert.Subject.CommonName, until)
		case late && (!a.Cert.Equal(old.Cert) || !until.Equal(activateAt.Add(time.Minute))):
			t.Fatalf("renewed a minute before: signs with %q until %v, want the old root until %v", a.Cert.Subject.CommonName, until, activateAt.Add(time.Minute))
		}
	}
}

// TestManagerFollowsHold: a Follower puts a held state in service again
// when the hold ends, though the stored state did not change, and not
// before.
func TestManagerFollowsHold(t *testing.T) {
	s, _, first, second := holdRenewed(t)
	store := &memStore{}
	store.put(s)
	now := lcT0.Add(time.Hour + 30*time.Second)
	mgr := keymgr.NewManager(spiffeid.RequireTrustDomainFromString("cluster.local"), nil)
	mgr.HoldNew(2 * time.Minute)
	changes := 0
	f := &keymgr.Follower{Store: store, Target: mgr, Now: func() time.Time { return now }, OnChange: func(*keymgr.State) { changes++ }}
	steps := []struct {
		at      time.Duration // after the renewal
		changed bool
		signs   *keymgr.AuthorityRecord
	}{
		{30 * time.Second, true, first},
		{time.Minute, false, first},
		{2*time.Minute - time.Nanosecond, false, first},
		{2 * time.Minute, true, second},
		{3 * time.Minute, false, second},
	}
	for _, st := range steps {
		now = lcT0.Add(time.Hour + st.at)
		changed, err := f.Sync(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if changed != st.changed || !mgr.Signing().Equal(st.signs.Cert) {
			t.Fatalf("%v after the renewal: changed %v, signs with %q; want %v, %q", st.at, changed, mgr.Signing().Subject.CommonName,
				st.changed, st.signs.Cert.Subject.CommonName)
		}
	}
	if changes != 2 {
		t.Fatalf("OnChange heard %d times, want 2: the state, and the end of the hold", changes)
	}
}

func TestCheckHold(t *testing.T) {
	tests := []struct {
		hold, ttl time.Duration
		renewAt   float64
		want      string
	}{
		{2 * time.Minute, keymgr.DefaultIntermediateTTL, keymgr.DefaultRenewAt, ""},
		{0, 80 * time.Second, 0.75, ""},
		{19 * time.Second, 80 * time.Second, 0.75, ""},
		{20 * time.Second, 80 * time.Second, 0.75, "the CRL propagation time 20s is not shorter than the time between two renewals (20s)"},
		{31 * time.Second, 80 * time.Second, 0.25, "the CRL propagation time 31s is more than half of what is left of an intermediate when it is renewed (20s)"},
		{time.Hour, 0, 0, ""}, // no upstream
		{-time.Second, 0, 0, "negative"},
		{19 * time.Hour, 72 * time.Hour, 0, "is more than half"}, // renewAt out of range: the default's
	}
	for _, tt := range tests {
		err := keymgr.CheckHold(tt.hold, tt.ttl, tt.renewAt)
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("CheckHold(%v, %v, %v) = %v, want %q", tt.hold, tt.ttl, tt.renewAt, err, tt.want)
		}
	}
}
