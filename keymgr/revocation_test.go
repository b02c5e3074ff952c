package keymgr_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/storetest"
	"github.com/meshca/meshca/keymgr/upstream"
)

// revocationState is an active authority signing with an intermediate
// renewed from the self upstream (the state holds both keys) and a
// retired one.
func revocationState(t *testing.T, now time.Time) *keymgr.State {
	t.Helper()
	inter := storetest.NewRenewedRecords(t, now.Add(-time.Hour), upstream.Ref{Type: "self"}, keymgr.PhaseActive)[0]
	retired := storetest.NewRecord(t, keymgr.PhaseRetired, now.Add(-2*time.Hour))
	retired.Key = nil
	return &keymgr.State{Sequence: 3, Authorities: []*keymgr.AuthorityRecord{retired, inter}}
}

// testCRL is a CRL of rec's signing certificate, listing serials.
func testCRL(t testing.TB, rec *keymgr.AuthorityRecord, number int64, now time.Time, serials ...int64) keymgr.CRLRecord {
	t.Helper()
	tmpl := &x509.RevocationList{Number: big.NewInt(number), ThisUpdate: now.Add(-time.Minute), NextUpdate: now.Add(24 * time.Hour)}
	for _, s := range serials {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: big.NewInt(s), RevocationTime: now})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, rec.Cert, rec.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := keymgr.NewCRLRecord(rec.ID(), der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func rev(serial int64, issuer string, now time.Time) keymgr.Revocation {
	return keymgr.Revocation{Serial: big.NewInt(serial), Issuer: issuer, Reason: 1, RevokedAt: now, NotAfter: now.Add(time.Hour), Subject: "spiffe://td/ns/a/sa/b", By: "test"}
}

func TestRevoke(t *testing.T) {
	now := time.Now()
	s := revocationState(t, now)
	active := s.Authorities[1]
	id, rootID, retiredID := active.ID(), active.RootID(), s.Authorities[0].ID()
	imported := storetest.NewIntermediateRecords(t, now, keymgr.PhasePrepared)[0]
	noCRLSign := importedWithoutCRLSign(t, now)
	s.Authorities = append(s.Authorities, imported, noCRLSign)
	with := func(r keymgr.Revocation, edit func(*keymgr.Revocation)) keymgr.Revocation { edit(&r); return r }
	tests := []struct {
		name      string
		in        []keymgr.Revocation
		wantAdded int
		wantErr   string
	}{
		{"a leaf", []keymgr.Revocation{rev(7, id, now)}, 1, ""},
		{"an intermediate, by its root", []keymgr.Revocation{rev(8, rootID, now)}, 1, ""},
		{"an imported chain's CA", []keymgr.Revocation{rev(8, keymgr.Fingerprint(imported.Chain[0]), now)}, 0,
			`meshca cannot publish a CRL of "CN=storetest intermediate 1,O=storetest.example": meshca holds no key of it, and no upstream does`},
		{"an imported CA without cRLSign", []keymgr.Revocation{rev(8, noCRLSign.ID(), now)}, 0, "its certificate lacks the cRLSign key usage"},
		{"unknown issuer", []keymgr.Revocation{rev(9, "", now)}, 1, ""},
		{"already revoked", []keymgr.Revocation{rev(1, id, now)}, 0, ""},
		{"twice in one call", []keymgr.Revocation{rev(7, id, now), rev(7, id, now)}, 1, ""},
		{"same serial, other issuer", []keymgr.Revocation{rev(1, rootID, now)}, 1, ""},
		{"already expired", []keymgr.Revocation{with(rev(7, id, now), func(r *keymgr.Revocation) { r.NotAfter = now.Add(-time.Hour) })}, 0, ""},
		{"expired within the grace", []keymgr.Revocation{with(rev(7, id, now), func(r *keymgr.Revocation) { r.NotAfter = now.Add(-time.Minute) })}, 1, ""},
		{"a retired issuer", []keymgr.Revocation{rev(7, id, now), rev(8, retiredID, now)}, 0, "no CA of the state that is not retired has this fingerprint"},
		{"a stranger issuer", []keymgr.Revocation{rev(7, strings.Repeat("ab", 32), now)}, 0, "no CA of the state"},
		{"issuer not a fingerprint", []keymgr.Revocation{rev(7, id[:16], now)}, 0, "is not a hex SHA-256 fingerprint"},
		{"uppercase issuer", []keymgr.Revocation{rev(7, strings.ToUpper(id), now)}, 0, "is not a hex SHA-256 fingerprint"},
		{"no serial", []keymgr.Revocation{with(rev(7, id, now), func(r *keymgr.Revocation) { r.Serial = nil })}, 0, "revocation 1 (serial none): the serial number must be positive"},
		{"serial 0", []keymgr.Revocation{rev(0, id, now)}, 0, "the serial number must be positive"},
		{"negative serial", []keymgr.Revocation{rev(-5, id, now)}, 0, "the serial number must be positive"},
		{"serial too long", []keymgr.Revocation{with(rev(7, id, now), func(r *keymgr.Revocation) { r.Serial = new(big.Int).Lsh(big.NewInt(1), 160) })}, 0, "longer than 20 octets"},
		{"reason 7", []keymgr.Revocation{with(rev(7, id, now), func(r *keymgr.Revocation) { r.Reason = 7 })}, 0, "reason 7 is not"},
		{"reason removeFromCRL", []keymgr.Revocation{with(rev(7, id, now), func(r *keymgr.Revocation) { r.Reason = 8 })}, 0, "reason 8 is not"},
		{"reason 11", []keymgr.Revocation{with(rev(7, id, now), func(r *keymgr.Revocation) { r.Reason = 11 })}, 0, "reason 11 is not"},
		{"no NotAfter", []keymgr.Revocation{with(rev(7, id, now), func(r *keymgr.Revocation) { r.NotAfter = time.Time{} })}, 0, "no NotAfter"},
		{"no time", []keymgr.Revocation{with(rev(7, id, now), func(r *keymgr.Revocation) { r.RevokedAt = time.Time{} })}, 0, "no revocation time"},
		{"the second of two is bad", []keymgr.Revocation{rev(7, id, now), rev(0, id, now)}, 0, "revocation 2 (serial 0)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := s.Clone()
			if _, err := s.Revoke([]keymgr.Revocation{rev(1, id, now)}, now); err != nil {
				t.Fatal(err)
			}
			before := s.Clone()
			added, err := s.Revoke(tt.in, now)
			var se *keymgr.StateError
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Revoke: %v", err)
			case tt.wantErr != "" && (!errors.As(err, &se) || se.Verb != keymgr.VerbRevoke || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Revoke err = %v, want a revoke StateError with %q", err, tt.wantErr)
			case added != tt.wantAdded:
				t.Fatalf("added %d, want %d", added, tt.wantAdded)
			case len(s.Revocations) != len(before.Revocations)+added:
				t.Fatalf("%d revocations after adding %d to %d", len(s.Revocations), added, len(before.Revocations))
			case err != nil && storetest.Diff(s, before) != "":
				t.Fatalf("a refused Revoke changed the state: %s", storetest.Diff(s, before))
			}
			if err := s.Validate(); err != nil {
				t.Fatalf("the state after Revoke is invalid: %v", err)
			}
		})
	}
}

func TestRevokeCopiesTheSerial(t *testing.T) {
	now := time.Now()
	s := revocationState(t, now)
	r := rev(5, s.Authorities[1].ID(), now)
	if _, err := s.Revoke([]keymgr.Revocation{r}, now); err != nil {
		t.Fatal(err)
	}
	r.Serial.SetInt64(6)
	if got := s.Revocations[0].Serial.Int64(); got != 5 {
		t.Fatalf("the caller changed the stored serial to %d", got)
	}
}

func TestUnrevoke(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name    string
		serial  *big.Int
		issuer  string
		wantErr error
		left    int
	}{
		{"by issuer", big.NewInt(1), "leaf", nil, 2},
		{"every issuer", big.NewInt(1), "", nil, 1},
		{"an unknown issuer entry only", big.NewInt(2), "", nil, 2},
		{"not revoked", big.NewInt(3), "", keymgr.ErrNotRevoked, 3},
		{"not by that issuer", big.NewInt(2), "leaf", keymgr.ErrNotRevoked, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := revocationState(t, now)
			a := s.Authorities[1]
			issuer := map[string]string{"leaf": a.ID(), "": ""}[tt.issuer]
			if _, err := s.Revoke([]keymgr.Revocation{rev(1, a.ID(), now), rev(1, a.RootID(), now), rev(2, "", now)}, now); err != nil {
				t.Fatal(err)
			}
			before := s.Clone()
			err := s.Unrevoke(tt.serial, issuer)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Unrevoke err = %v, want %v", err, tt.wantErr)
			}
			if len(s.Revocations) != tt.left {
				t.Fatalf("%d revocations left, want %d", len(s.Revocations), tt.left)
			}
			if len(before.Revocations) != 3 {
				t.Fatal("Unrevoke changed a clone's revocations")
			}
		})
	}
	var se *keymgr.StateError
	if err := (&keymgr.State{}).Unrevoke(nil, ""); !errors.As(err, &se) {
		t.Fatalf("Unrevoke(nil) err = %v, want a StateError", err)
	}
}

func TestNodeBlocks(t *testing.T) {
	now := time.Now()
	s := &keymgr.State{}
	b := keymgr.NodeBlock{Node: "node-1", Since: now.Add(-time.Hour), At: now, Reason: "stolen", By: "alice"}
	if err := s.Block(b); err != nil {
		t.Fatal(err)
	}
	again := b
	again.Reason = "again"
	if err := s.Block(again); err != nil || len(s.Blocked) != 1 || s.Blocked[0].Reason != "stolen" {
		t.Fatalf("blocking again: err %v, blocks %+v; want the first block kept", err, s.Blocked)
	}
	if got, ok := s.NodeBlocked("node-1"); !ok || got != b {
		t.Fatalf("NodeBlocked = %+v, %v", got, ok)
	}
	if _, ok := s.NodeBlocked("node-2"); ok {
		t.Fatal("node-2 is blocked")
	}
	for _, bad := range []keymgr.NodeBlock{{Node: "", At: now}, {Node: " node ", At: now}, {Node: "node-3"}} {
		var se *keymgr.StateError
		if err := s.Block(bad); !errors.As(err, &se) || se.Verb != keymgr.VerbBlock {
			t.Errorf("Block(%+v) err = %v, want a block StateError", bad, err)
		}
	}
	c := s.Clone()
	if err := s.Unblock("node-1"); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.NodeBlocked("node-1"); !ok {
		t.Fatal("Unblock changed a clone")
	}
	if err := s.Unblock("node-1"); !errors.Is(err, keymgr.ErrNotBlocked) {
		t.Fatalf("Unblock twice: err = %v, want ErrNotBlocked", err)
	}
}

func TestPruneRevocations(t *testing.T) {
	now := time.Now()
	s := revocationState(t, now)
	id := s.Authorities[1].ID()
	if _, err := s.Revoke([]keymgr.Revocation{rev(1, id, now), rev(2, id, now.Add(time.Hour))}, now); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		at        time.Time
		pruned    int
		remaining int
	}{
		{now.Add(time.Hour), 0, 2},
		{now.Add(time.Hour + keymgr.RevocationGrace), 0, 2},
		{now.Add(time.Hour + keymgr.RevocationGrace + time.Second), 1, 1},
		{now.Add(3 * time.Hour), 1, 0},
		{now.Add(4 * time.Hour), 0, 0},
	} {
		if n := s.PruneRevocations(step.at); n != step.pruned || len(s.Revocations) != step.remaining {
			t.Fatalf("at +%v: pruned %d leaving %d, want %d leaving %d", step.at.Sub(now), n, len(s.Revocations), step.pruned, step.remaining)
		}
	}
}

// importedWithoutCRLSign is a prepared authority whose root has no
// cRLSign key usage.
func importedWithoutCRLSign(t *testing.T, now time.Time) *keymgr.AuthorityRecord {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "no crl sign"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(48 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, SubjectKeyId: []byte{1, 2, 3}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &keymgr.AuthorityRecord{Phase: keymgr.PhasePrepared, Root: c, Cert: c, Key: key, History: []keymgr.Transition{{To: keymgr.PhasePrepared, At: now}}}
}

func TestIssuerOf(t *testing.T) {
	now := time.Now()
	s := revocationState(t, now)
	s.Authorities[1] = storetest.NewIntermediateRecords(t, now, keymgr.PhaseActive)[0]
	a := s.Authorities[1]
	leaf := issueLeaf(t, a, now)
	stranger := storetest.NewRecord(t, keymgr.PhaseActive, now)
	tests := []struct {
		name string
		cert *x509.Certificate
		want string
	}{
		{"a leaf", leaf, a.ID()},
		{"the signing intermediate", a.Cert, keymgr.Fingerprint(a.Chain[0])},
		{"the top intermediate", a.Chain[0], a.RootID()},
		{"a retired root", s.Authorities[0].Root, ""},
		{"a stranger", stranger.Cert, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.View().IssuerOf(tt.cert)
			if got != tt.want || (err == nil) != (tt.want != "") {
				t.Fatalf("IssuerOf = %.16s, %v; want %.16s", got, err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), "no CA of the state that is not retired signed it") {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

// issueLeaf is a leaf signed by a's signing certificate.
func issueLeaf(t *testing.T, a *keymgr.AuthorityRecord, now time.Time) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(99), NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, a.Key.Public(), a.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCRLBundlePEM(t *testing.T) {
	now := time.Now()
	if got := (keymgr.View{State: &keymgr.State{}}).CRLBundlePEM(); len(got) != 0 {
		t.Fatalf("no CRL: bundle %q, want empty", got)
	}
	a, b := storetest.NewRecord(t, keymgr.PhaseActive, now), storetest.NewRecord(t, keymgr.PhasePrepared, now)
	ca, cb := testCRL(t, a, 1, now, 5), testCRL(t, b, 2, now)
	first, second := ca, cb
	if cb.Issuer < ca.Issuer {
		first, second = cb, ca
	}
	for _, order := range [][]keymgr.CRLRecord{{ca, cb}, {cb, ca}} {
		rest := (&keymgr.State{CRLs: order}).View().CRLBundlePEM()
		for i, want := range []keymgr.CRLRecord{first, second} {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil || block.Type != "X509 CRL" || string(block.Bytes) != string(want.DER) {
				t.Fatalf("block %d of the bundle is not the CRL of %.16s", i+1, want.Issuer)
			}
		}
		if len(rest) != 0 {
			t.Fatalf("the bundle has %d bytes more", len(rest))
		}
	}
	if got, ok := (&keymgr.State{CRLs: []keymgr.CRLRecord{ca, cb}}).View().CRL(cb.Issuer); !ok || got.Number.Int64() != 2 {
		t.Fatalf("CRL(%.16s) = %+v, %v", cb.Issuer, got, ok)
	}
}

func TestValidateRevocations(t *testing.T) {
	now := time.Now()
	base := func(t *testing.T) *keymgr.State {
		s := revocationState(t, now)
		s.CRLs = []keymgr.CRLRecord{testCRL(t, s.Authorities[1], 3, now, 1)}
		s.Blocked = []keymgr.NodeBlock{{Node: "n1", At: now}}
		if _, err := s.Revoke([]keymgr.Revocation{rev(1, s.Authorities[1].ID(), now)}, now); err != nil {
			t.Fatal(err)
		}
		return s
	}
	tests := []struct {
		name string
		edit func(s *keymgr.State)
		want string
	}{
		{"valid", func(*keymgr.State) {}, ""},
		{"revoked twice", func(s *keymgr.State) { s.Revocations = append(s.Revocations, s.Revocations[0]) }, "serial 1 is revoked twice by the same issuer"},
		{"bad reason", func(s *keymgr.State) { s.Revocations[0].Reason = 7 }, "revocation 1 (serial 1): reason 7"},
		{"blocked twice", func(s *keymgr.State) { s.Blocked = append(s.Blocked, s.Blocked[0]) }, `node "n1" is blocked twice`},
		{"block without time", func(s *keymgr.State) { s.Blocked[0].At = time.Time{} }, "node block 1: no block time"},
		{"two CRLs of an issuer", func(s *keymgr.State) { s.CRLs = append(s.CRLs, testCRL(t, s.Authorities[1], 4, now)) }, "two CRLs of the same issuer"},
		{"CRL issuer not a fingerprint", func(s *keymgr.State) { s.CRLs[0].Issuer = "x" }, `issuer "x" is not a hex SHA-256 fingerprint`},
		{"CRL number not the DER's", func(s *keymgr.State) { s.CRLs[0].Number = big.NewInt(9) }, "number 9 is not the CRL's 3"},
		{"CRL times not the DER's", func(s *keymgr.State) { s.CRLs[0].NextUpdate = now.Add(48 * time.Hour) }, "nextUpdate is not the CRL's"},
		{"CRL DER junk", func(s *keymgr.State) { s.CRLs[0].DER = []byte("junk") }, "the CRL does not parse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base(t)
			tt.edit(s)
			err := s.Validate()
			var se *keymgr.StateError
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.want != "" && (!errors.As(err, &se) || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestCloneRevocations(t *testing.T) {
	now := time.Now()
	s := revocationState(t, now)
	s.CRLs = []keymgr.CRLRecord{testCRL(t, s.Authorities[1], 1, now)}
	s.Blocked = []keymgr.NodeBlock{{Node: "n", At: now}}
	if _, err := s.Revoke([]keymgr.Revocation{rev(1, "", now)}, now); err != nil {
		t.Fatal(err)
	}
	c := s.Clone()
	c.Revocations[0].Reason = 4
	c.Blocked[0].Node = "m"
	c.CRLs[0].Issuer = "y"
	if s.Revocations[0].Reason != 1 || s.Blocked[0].Node != "n" || s.CRLs[0].Issuer == "y" {
		t.Fatal("changing a clone changed the state")
	}
}
