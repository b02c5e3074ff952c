package keymgr_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
)

// lcT0 is the fake clock's start: every lifecycle test counts from it.
var lcT0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// lcRootTTL is the lifetime of the roots the lifecycle tests generate.
const lcRootTTL = 90 * 24 * time.Hour

// lcGenerated returns a meshca-generated root authority made an hour
// before lcT0 (so valid from 1h2m before it) for lcRootTTL.
func lcGenerated(t *testing.T) *keymgr.AuthorityRecord {
	t.Helper()
	a, err := keymgr.NewRoot(keymgr.RootOptions{Organization: "cluster.local", TTL: lcRootTTL, Now: lcT0.Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return &keymgr.AuthorityRecord{Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true}
}

// lcImported returns an imported authority: an intermediate two levels
// under a root, with the intermediate between them as its chain.
func lcImported(t *testing.T) *keymgr.AuthorityRecord {
	t.Helper()
	o := testca.Options{NotBefore: lcT0.Add(-time.Hour), NotAfter: lcT0.Add(lcRootTTL)}
	root := testca.NewRoot(t, "imported root", o)
	mid := root.NewIntermediate(t, "imported intermediate", o)
	issuing := mid.NewIntermediate(t, "imported issuing", o)
	return &keymgr.AuthorityRecord{Root: root.Cert, Cert: issuing.Cert, Chain: []*x509.Certificate{mid.Cert}, Key: issuing.Key}
}

// lcBootstrapped returns a state whose only authority, generated, became
// active at lcT0.
func lcBootstrapped(t *testing.T) (*keymgr.State, *keymgr.AuthorityRecord) {
	t.Helper()
	s := &keymgr.State{}
	a := lcGenerated(t)
	if err := s.Bootstrap(a, lcT0, "generated on first start"); err != nil {
		t.Fatal(err)
	}
	return s, a
}

// lcRotating returns a state where a (active) issued leaves of 24h until
// lcT0+24h and b, generated, was prepared at lcT0+1h. With the default
// margin b may become active at lcT0+13h5m.
func lcRotating(t *testing.T) (s *keymgr.State, a, b *keymgr.AuthorityRecord) {
	t.Helper()
	s, a = lcBootstrapped(t)
	s.RecordIssued(a.ID(), lcT0.Add(24*time.Hour), 24*time.Hour)
	b = lcGenerated(t)
	if err := s.Prepare(b, lcT0.Add(time.Hour), "next root"); err != nil {
		t.Fatal(err)
	}
	return s, a, b
}

// lcRotated is lcRotating after b became active at lcT0+14h: a is
// previous, with leaves valid until lcT0+24h.
func lcRotated(t *testing.T) (s *keymgr.State, a, b *keymgr.AuthorityRecord) {
	t.Helper()
	s, a, b = lcRotating(t)
	if err := s.Activate(b.ID(), lcT0.Add(14*time.Hour), keymgr.DefaultGuards(), false, "rotate"); err != nil {
		t.Fatal(err)
	}
	return s, a, b
}

// lcCA makes a CA certificate with usage, signed by parent (self-signed
// when parent is nil).
func lcCA(t *testing.T, name string, usage x509.KeyUsage, parent *x509.Certificate, parentKey crypto.Signer) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: name},
		NotBefore: lcT0.Add(-time.Hour), NotAfter: lcT0.Add(lcRootTTL),
		KeyUsage: usage, BasicConstraintsValid: true, IsCA: true,
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

// lcCheckErr fails t unless err is a *StateError (guard false) or a
// *GuardError (guard true) whose message contains want; want "" means
// no error.
func lcCheckErr(t *testing.T, err error, guard bool, want string) {
	t.Helper()
	var (
		se *keymgr.StateError
		ge *keymgr.GuardError
	)
	switch {
	case want == "" && err != nil:
		t.Fatalf("err = %v, want none", err)
	case want == "":
		return
	case err == nil:
		t.Fatalf("no error, want one with %q", want)
	case guard && !errors.As(err, &ge):
		t.Fatalf("err = %#v, want a *GuardError", err)
	case !guard && !errors.As(err, &se):
		t.Fatalf("err = %#v, want a *StateError", err)
	case !strings.HasPrefix(err.Error(), "keymgr: "):
		t.Errorf("err = %q, want the keymgr: prefix", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %q, want it to contain %q", err, want)
	}
}

func TestBootstrap(t *testing.T) {
	s, a := lcBootstrapped(t)
	want := []keymgr.Transition{
		{To: keymgr.PhasePrepared, At: lcT0, Reason: "generated on first start"},
		{To: keymgr.PhaseActive, At: lcT0, Reason: "generated on first start"},
	}
	switch {
	case a.Phase != keymgr.PhaseActive:
		t.Errorf("phase %s, want active", a.Phase)
	case len(a.History) != 2 || a.History[0] != want[0] || a.History[1] != want[1]:
		t.Errorf("history %+v, want %+v", a.History, want)
	case s.Sequence != 1:
		t.Errorf("sequence %d, want 1", s.Sequence)
	case s.Active() != a:
		t.Error("Active is not the bootstrapped authority")
	case len(s.Bundle()) != 1 || !s.Bundle()[0].Equal(a.Root):
		t.Error("the bundle is not the bootstrapped root")
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}

	err := s.Bootstrap(lcGenerated(t), lcT0, "again")
	lcCheckErr(t, err, false, "keymgr: bootstrap: the state already has an active authority ("+a.ID()[:16]+"): prepare the next one instead")
	err = (&keymgr.State{}).Bootstrap(&keymgr.AuthorityRecord{}, lcT0, "empty")
	lcCheckErr(t, err, false, "keymgr: bootstrap: the authority has no root certificate")
	if s.Sequence != 1 || len(s.Authorities) != 1 {
		t.Fatal("a refused bootstrap changed the state")
	}
}

func TestPrepare(t *testing.T) {
	tests := []struct {
		name   string
		rec    func(t *testing.T) *keymgr.AuthorityRecord
		reason string
	}{
		{name: "generated root", rec: lcGenerated, reason: "next root"},
		{name: "imported intermediate with a chain", rec: lcImported},
		{name: "intermediate signed by its root", rec: func(t *testing.T) *keymgr.AuthorityRecord {
			o := testca.Options{NotBefore: lcT0.Add(-time.Hour), NotAfter: lcT0.Add(lcRootTTL)}
			root := testca.NewRoot(t, "root", o)
			inter := root.NewIntermediate(t, "inter", o)
			return &keymgr.AuthorityRecord{Root: root.Cert, Cert: inter.Cert, Key: inter.Key}
		}},
		{name: "external certificate alone", rec: func(t *testing.T) *keymgr.AuthorityRecord {
			r := lcGenerated(t)
			r.Key, r.External, r.Generated = nil, true, false
			return r
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, a := lcBootstrapped(t)
			rec := tt.rec(t)
			now := lcT0.Add(time.Hour)
			if err := s.Prepare(rec, now, tt.reason); err != nil {
				t.Fatal(err)
			}
			want := keymgr.Transition{To: keymgr.PhasePrepared, At: now, Reason: tt.reason}
			switch {
			case rec.Phase != keymgr.PhasePrepared:
				t.Errorf("phase %s, want prepared", rec.Phase)
			case len(rec.History) != 1 || rec.History[0] != want:
				t.Errorf("history %+v, want [%+v]", rec.History, want)
			case s.Sequence != 2:
				t.Errorf("sequence %d, want 2", s.Sequence)
			case s.Active() != a:
				t.Error("prepare changed the active authority")
			case len(s.Bundle()) != 2 || !s.Bundle()[0].Equal(a.Root) || !s.Bundle()[1].Equal(rec.Root):
				t.Error("the bundle is not [active root, prepared root]")
			}
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPrepareRefused(t *testing.T) {
	o := testca.Options{NotBefore: lcT0.Add(-time.Hour), NotAfter: lcT0.Add(lcRootTTL)}
	root := testca.NewRoot(t, "root", o)
	inter := root.NewIntermediate(t, "inter", o)
	other := testca.NewRoot(t, "other", o)
	notCA := testca.NewRoot(t, "not a ca", testca.Options{NotBefore: o.NotBefore, NotAfter: o.NotAfter, NotCA: true})
	interNotCA := root.NewIntermediate(t, "inter not a ca", testca.Options{NotBefore: o.NotBefore, NotAfter: o.NotAfter, NotCA: true})
	noSign, noSignKey := lcCA(t, "no keyCertSign", x509.KeyUsageDigitalSignature, root.Cert, root.Key)
	later := testca.NewRoot(t, "later", testca.Options{NotBefore: lcT0.Add(time.Hour), NotAfter: lcT0.Add(lcRootTTL)})
	expired := testca.NewRoot(t, "expired", testca.Options{NotBefore: lcT0.Add(-48 * time.Hour), NotAfter: lcT0})
	expiredInter := root.NewIntermediate(t, "expired inter", testca.Options{NotBefore: lcT0.Add(-48 * time.Hour), NotAfter: lcT0.Add(-time.Second)})
	underExpired := expiredInter.NewIntermediate(t, "under expired", o)
	self := func(ca *testca.CA) *keymgr.AuthorityRecord {
		return &keymgr.AuthorityRecord{Root: ca.Cert, Cert: ca.Cert, Key: ca.Key}
	}
	tests := []struct {
		name string
		rec  func(t *testing.T, s *keymgr.State, active *keymgr.AuthorityRecord) *keymgr.AuthorityRecord
		want string
	}{
		{"nil record", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord { return nil }, "keymgr: prepare: the authority has no root certificate"},
		{"no root", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			return &keymgr.AuthorityRecord{Cert: root.Cert, Key: root.Key}
		}, "keymgr: prepare: the authority has no root certificate"},
		{"no signing certificate", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			return &keymgr.AuthorityRecord{Root: root.Cert, Key: root.Key}
		}, "the authority has no signing certificate"},
		{"already has a phase", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			r := self(root)
			r.Phase = keymgr.PhasePrepared
			return r
		}, "the record already has a phase or a history"},
		{"already has a history", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			r := self(root)
			r.History = []keymgr.Transition{{To: keymgr.PhasePrepared, At: lcT0}}
			return r
		}, "the record already has a phase or a history"},
		{"root not a CA", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord { return self(notCA) }, "the root is not a CA certificate"},
		{"root not self-signed", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord { return self(inter) }, "the root is not self-signed"},
		{"signing certificate not a CA", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			return &keymgr.AuthorityRecord{Root: root.Cert, Cert: interNotCA.Cert, Key: interNotCA.Key}
		}, "the signing certificate is not a CA"},
		{"signing certificate without keyCertSign", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			return &keymgr.AuthorityRecord{Root: root.Cert, Cert: noSign, Key: noSignKey}
		}, "the signing certificate lacks the keyCertSign key usage"},
		{"chain holds the root", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			return &keymgr.AuthorityRecord{Root: root.Cert, Cert: inter.Cert, Chain: []*x509.Certificate{root.Cert}, Key: inter.Key}
		}, "the chain holds the root"},
		{"chain repeats the signing certificate", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			return &keymgr.AuthorityRecord{Root: root.Cert, Cert: inter.Cert, Chain: []*x509.Certificate{inter.Cert}, Key: inter.Key}
		}, "the chain repeats the signing certificate"},
		{"root with a chain", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			r := self(root)
			r.Chain = []*x509.Certificate{inter.Cert}
			return r
		}, "a root that signs by itself has no chain"},
		{"external with a key", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			r := self(root)
			r.External = true
			return r
		}, "an external authority's key lives in its backend"},
		{"no key", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			return &keymgr.AuthorityRecord{Root: root.Cert, Cert: root.Cert}
		}, "the authority has no private key"},
		{"key does not match", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			return &keymgr.AuthorityRecord{Root: root.Cert, Cert: root.Cert, Key: other.Key}
		}, "the private key does not match the signing certificate's public key"},
		{"not valid yet", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord { return self(later) },
			`"CN=later,O=meshca test" is not valid before 2030-01-01T01:00:00Z`},
		{"expired", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord { return self(expired) },
			`"CN=expired,O=meshca test" expired at 2030-01-01T00:00:00Z`},
		{"chain expired", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			return &keymgr.AuthorityRecord{Root: root.Cert, Cert: underExpired.Cert, Chain: []*x509.Certificate{expiredInter.Cert}, Key: underExpired.Key}
		}, `"CN=expired inter,O=meshca test" expired at 2029-12-31T23:59:59Z`},
		{"does not chain to the root", func(*testing.T, *keymgr.State, *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			return &keymgr.AuthorityRecord{Root: other.Cert, Cert: inter.Cert, Key: inter.Key}
		}, "the signing certificate does not chain to the root through the chain"},
		{"chain missing", func(t *testing.T, _ *keymgr.State, _ *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			r := lcImported(t)
			r.Chain = nil
			return r
		}, "the signing certificate does not chain to the root through the chain"},
		{"already active", func(_ *testing.T, _ *keymgr.State, a *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			return &keymgr.AuthorityRecord{Root: a.Root, Cert: a.Cert, Key: a.Key}
		}, "this signing certificate is already in the state (active)"},
		{"already prepared", func(t *testing.T, s *keymgr.State, _ *keymgr.AuthorityRecord) *keymgr.AuthorityRecord {
			if err := s.Prepare(self(root), lcT0, ""); err != nil {
				t.Fatal(err)
			}
			return self(root)
		}, "this signing certificate is already in the state (prepared)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, a := lcBootstrapped(t)
			rec := tt.rec(t, s, a)
			seq, n := s.Sequence, len(s.Authorities)
			var phase keymgr.Phase
			var history int
			if rec != nil {
				phase, history = rec.Phase, len(rec.History)
			}
			err := s.Prepare(rec, lcT0, "reason")
			lcCheckErr(t, err, false, tt.want)
			if s.Sequence != seq || len(s.Authorities) != n {
				t.Error("a refused prepare changed the state")
			}
			if rec != nil && (rec.Phase != phase || len(rec.History) != history) {
				t.Error("a refused prepare changed the record")
			}
		})
	}
}

func TestPrepareWithoutActive(t *testing.T) {
	s := &keymgr.State{}
	err := s.Prepare(lcGenerated(t), lcT0, "")
	lcCheckErr(t, err, false, "keymgr: prepare: the state has no active authority yet: bootstrap adds the first one")
	if s.Sequence != 0 || len(s.Authorities) != 0 {
		t.Fatal("a refused prepare changed the state")
	}
}
