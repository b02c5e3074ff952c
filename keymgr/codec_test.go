package keymgr_test

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/storetest"
)

// codecState is a state of every phase: a retired authority (still
// holding a key, which encoding must drop), previous, active, and an
// external prepared one without a key.
func codecState(t *testing.T) *keymgr.State {
	t.Helper()
	at := time.Now().Add(-time.Hour)
	retired := storetest.NewRecord(t, keymgr.PhaseRetired, at.Add(-time.Hour))
	previous := storetest.NewRecord(t, keymgr.PhasePrevious, at)
	previous.LatestLeafNotAfter, previous.LongestLeafTTL = at.Add(24*time.Hour), 24*time.Hour+time.Nanosecond
	active := storetest.NewRecord(t, keymgr.PhaseActive, at)
	external := storetest.NewRecord(t, keymgr.PhasePrepared, at)
	external.Key, external.External = nil, true
	return &keymgr.State{Sequence: 42, Authorities: []*keymgr.AuthorityRecord{retired, previous, active, external}}
}

func encode(t *testing.T, s *keymgr.State) map[string][]byte {
	t.Helper()
	entries, err := keymgr.EncodeState(s)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

func TestStateCodecRoundTrip(t *testing.T) {
	s := codecState(t)
	entries := encode(t, s)
	keyed := []*keymgr.AuthorityRecord{s.Authorities[1], s.Authorities[2]}
	if len(entries) != 1+len(keyed) {
		t.Fatalf("entries %v, want state.json and the keys of the previous and active authorities", names(entries))
	}
	for _, r := range keyed {
		name := keymgr.KeyEntry(r.Cert)
		if !strings.HasPrefix(name, "key-"+r.ID()[:16]) || entries[name] == nil {
			t.Fatalf("no key entry %s in %v", name, names(entries))
		}
		if !strings.Contains(string(entries[name]), "-----BEGIN PRIVATE KEY-----") {
			t.Errorf("%s is not PKCS#8 PEM", name)
		}
	}
	got, err := keymgr.DecodeState(entries)
	if err != nil {
		t.Fatal(err)
	}
	if d := storetest.Diff(got, s); d != "" {
		t.Fatal(d)
	}
	// Times are kept to the nanosecond, in UTC.
	if w, g := s.Authorities[1].LatestLeafNotAfter, got.Authorities[1].LatestLeafNotAfter; !g.Equal(w) || g.Location() != time.UTC {
		t.Errorf("LatestLeafNotAfter = %v, want %v in UTC", g, w)
	}
	again := encode(t, got)
	if string(again[keymgr.EntryState]) != string(entries[keymgr.EntryState]) {
		t.Error("encoding a decoded state changed state.json")
	}
}

func TestStateCodecDocument(t *testing.T) {
	entries := encode(t, codecState(t))
	var doc struct {
		Format      int
		Sequence    uint64
		Authorities []map[string]any
	}
	if err := json.Unmarshal(entries[keymgr.EntryState], &doc); err != nil {
		t.Fatal(err)
	}
	// Every authority signs with its root: the ids of format 1 (the
	// roots') are the same, and a meshca that reads only format 1 reads it.
	if doc.Format != 1 || doc.Sequence != 42 || len(doc.Authorities) != 4 {
		t.Fatalf("document %+v", doc)
	}
	for _, field := range []string{"id", "phase", "root", "cert", "history"} {
		if _, ok := doc.Authorities[2][field]; !ok {
			t.Errorf("authority has no %q field", field)
		}
	}
	if _, ok := doc.Authorities[0]["key"]; ok {
		t.Error("a retired authority names a key entry")
	}
	if strings.Contains(string(entries[keymgr.EntryState]), "PRIVATE KEY") {
		t.Error("state.json holds a private key")
	}
}

// TestStateCodecSharedRoot: intermediates under one root are written in
// format 2, each named by its signing certificate, and read back apart.
func TestStateCodecSharedRoot(t *testing.T) {
	at := time.Now().Add(-time.Hour)
	rs := storetest.NewIntermediateRecords(t, at, keymgr.PhasePrevious, keymgr.PhaseActive)
	s := &keymgr.State{Sequence: 3, Authorities: rs}
	entries := encode(t, s)
	var doc struct {
		Format      int
		Authorities []struct{ ID string }
	}
	if err := json.Unmarshal(entries[keymgr.EntryState], &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Format != 2 || len(doc.Authorities) != 2 {
		t.Fatalf("document %+v, want format 2", doc)
	}
	for i, a := range doc.Authorities {
		if want := keymgr.Fingerprint(rs[i].Cert); a.ID != want {
			t.Errorf("authority %d: id %s, want its signing certificate's fingerprint %s", i+1, a.ID, want)
		}
	}
	got, err := keymgr.DecodeState(entries)
	if err != nil {
		t.Fatal(err)
	}
	if d := storetest.Diff(got, s); d != "" {
		t.Fatal(d)
	}
}

// TestStateCodecFormat1Intermediate: a state that names authorities by
// their roots (format 1) is read, an intermediate's authority included,
// and while no two authorities share a root it is written so again.
func TestStateCodecFormat1Intermediate(t *testing.T) {
	rs := storetest.NewIntermediateRecords(t, time.Now().Add(-time.Hour), keymgr.PhaseActive)
	entries := encode(t, &keymgr.State{Sequence: 1, Authorities: rs})
	var doc map[string]any
	if err := json.Unmarshal(entries[keymgr.EntryState], &doc); err != nil {
		t.Fatal(err)
	}
	if f, id := doc["format"], doc["authorities"].([]any)[0].(map[string]any)["id"]; f != 1.0 || id != keymgr.Fingerprint(rs[0].Root) {
		t.Fatalf("format %v, id %.16v; want format 1 and the root's fingerprint", f, id)
	}
	got, err := keymgr.DecodeState(entries)
	if err != nil {
		t.Fatal(err)
	}
	if got.Authorities[0].ID() != keymgr.Fingerprint(rs[0].Cert) {
		t.Errorf("ID() = %.16s, want the signing certificate's fingerprint", got.Authorities[0].ID())
	}
	// In format 1 an id is the root's: the signing certificate's is wrong.
	doc["authorities"].([]any)[0].(map[string]any)["id"] = keymgr.Fingerprint(rs[0].Cert)
	if entries[keymgr.EntryState], err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	if _, err := keymgr.DecodeState(entries); err == nil || !strings.Contains(err.Error(), "is not the root's fingerprint") {
		t.Fatalf("format 1 with a signing certificate's id: err = %v", err)
	}
}

func TestEncodeStateRefuses(t *testing.T) {
	at := time.Now()
	good := func() *keymgr.AuthorityRecord { return storetest.NewRecord(t, keymgr.PhaseActive, at) }
	other := good()
	tests := []struct {
		name   string
		record func() *keymgr.AuthorityRecord
		second *keymgr.AuthorityRecord
		want   string
	}{
		{"no root", func() *keymgr.AuthorityRecord { r := good(); r.Root = nil; return r }, nil, "no root certificate"},
		{"no cert", func() *keymgr.AuthorityRecord { r := good(); r.Cert = nil; return r }, nil, "no signing certificate"},
		{"key of another", func() *keymgr.AuthorityRecord { r := good(); r.Key = other.Key; return r }, nil, "private key: does not match"},
		{"unknown phase", func() *keymgr.AuthorityRecord { r := good(); r.Phase = "paused"; return r }, nil, `unknown phase "paused"`},
		{"unknown phase in history", func() *keymgr.AuthorityRecord {
			r := good()
			r.History[0].To = "paused"
			return r
		}, nil, `history 1: unknown phase`},
		{"negative TTL", func() *keymgr.AuthorityRecord { r := good(); r.LongestLeafTTL = -time.Second; return r }, nil, "negative"},
		{"cert not under root", func() *keymgr.AuthorityRecord { r := good(); r.Cert = other.Cert; r.Key = other.Key; return r }, nil, "not signed by"},
		{"one authority twice", func() *keymgr.AuthorityRecord { return other }, other, "have the same signing certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &keymgr.State{Authorities: []*keymgr.AuthorityRecord{tt.record()}}
			if tt.second != nil {
				s.Authorities = append(s.Authorities, tt.second)
			}
			_, err := keymgr.EncodeState(s)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	if _, err := keymgr.EncodeState(nil); err == nil {
		t.Error("EncodeState(nil) succeeded")
	}
}

func TestDecodeStateRefuses(t *testing.T) {
	s := codecState(t)
	prevKey, activeKey := keymgr.KeyEntry(s.Authorities[1].Cert), keymgr.KeyEntry(s.Authorities[2].Cert)
	strangerKey, err := pemutil.EncodePrivateKey(storetest.NewRecord(t, keymgr.PhaseActive, time.Now()).Key)
	if err != nil {
		t.Fatal(err)
	}
	// doc edits authority 3 (the active one) of the document.
	doc := func(edit func(doc map[string]any, active map[string]any)) func(map[string][]byte) {
		return func(e map[string][]byte) {
			var d map[string]any
			if err := json.Unmarshal(e[keymgr.EntryState], &d); err != nil {
				t.Fatal(err)
			}
			edit(d, d["authorities"].([]any)[2].(map[string]any))
			b, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			e[keymgr.EntryState] = b
		}
	}
	field := func(k string, v any) func(map[string][]byte) {
		return doc(func(_, a map[string]any) { a[k] = v })
	}
	tests := []struct {
		name      string
		edit      func(map[string][]byte)
		wantEntry string
		want      string
	}{
		{"no document", func(e map[string][]byte) { delete(e, keymgr.EntryState) }, keymgr.EntryState, "missing"},
		{"not JSON", func(e map[string][]byte) { e[keymgr.EntryState] = []byte("apiVersion: v1") }, keymgr.EntryState, "not a CA state document"},
		{"trailing data", func(e map[string][]byte) { e[keymgr.EntryState] = append(e[keymgr.EntryState], "{}"...) }, keymgr.EntryState, "data follows"},
		{"newer format", doc(func(d, _ map[string]any) { d["format"] = keymgr.StateFormat + 1 }), keymgr.EntryState, "format version 5 is not supported"},
		{"no format", doc(func(d, _ map[string]any) { delete(d, "format") }), keymgr.EntryState, "format version 0 is not supported"},
		{"unknown field", doc(func(d, _ map[string]any) { d["owner"] = "x" }), keymgr.EntryState, `unknown field "owner"`},
		{"unknown authority field", field("issuer", "x"), keymgr.EntryState, `unknown field "issuer"`},
		// encoding/json matches names regardless of case and keeps the
		// last of two: a person reading the document would see another
		// state than meshca.
		{"a field in other case", func(e map[string][]byte) {
			e[keymgr.EntryState] = bytes.Replace(e[keymgr.EntryState], []byte(`"sequence": `), []byte(`"SEQUENCE": `), 1)
		}, keymgr.EntryState, `the document has the unknown field "SEQUENCE"`},
		{"a field twice", func(e map[string][]byte) {
			e[keymgr.EntryState] = bytes.Replace(e[keymgr.EntryState], []byte(`"sequence": `), []byte(`"sequence": 1, "sequence": `), 1)
		}, keymgr.EntryState, `the document has the field "sequence" twice`},
		{"an authority's field twice", func(e map[string][]byte) {
			e[keymgr.EntryState] = bytes.Replace(e[keymgr.EntryState], []byte(`"phase": "active"`), []byte(`"phase": "retired", "phase": "active"`), 1)
		}, keymgr.EntryState, `the document.authorities[2] has the field "phase" twice`},
		{"unknown phase", field("phase", "paused"), keymgr.EntryState, `authority 3 (`},
		{"bad root PEM", field("root", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), keymgr.EntryState, "authority 3 (" + s.Authorities[2].ID()[:16] + "): root:"},
		{"two roots", field("root", string(pemutil.EncodeCertificates(s.Authorities[2].Root, s.Authorities[1].Root))), keymgr.EntryState, "root: holds 2 certificates"},
		{"wrong id", field("id", s.Authorities[1].ID()), keymgr.EntryState, "is not the root's fingerprint"},
		{"cert of another root", field("cert", string(pemutil.EncodeCertificates(s.Authorities[1].Cert))), keymgr.EntryState, "not signed by"},
		{"root that is not self-signed", doc(func(_, a map[string]any) {
			c := chainedIntermediate(t)
			a["root"], a["id"] = string(pemutil.EncodeCertificates(c)), keymgr.Fingerprint(c)
		}), keymgr.EntryState, "root: not self-issued"},
		{"bad chain", field("chain", "junk"), keymgr.EntryState, "chain:"},
		{"bad time", doc(func(_, a map[string]any) {
			a["history"].([]any)[0].(map[string]any)["at"] = "yesterday"
		}), keymgr.EntryState, `history 1: time "yesterday" is not RFC 3339`},
		{"bad leaf time", field("latestLeafNotAfter", "1700000000"), keymgr.EntryState, "latestLeafNotAfter"},
		{"bad TTL", field("longestLeafTTL", "-1h"), keymgr.EntryState, "longestLeafTTL"},
		{"key entry misnamed", field("key", prevKey), keymgr.EntryState, "is not the one named for its signing certificate"},
		{"retired with a key", doc(func(d, _ map[string]any) {
			d["authorities"].([]any)[0].(map[string]any)["key"] = "key-0000000000000000.pem"
		}), keymgr.EntryState, "a retired authority has a key entry"},
		{"one root twice", doc(func(d, _ map[string]any) {
			as := d["authorities"].([]any)
			d["authorities"] = append(as, as[3])
		}), keymgr.EntryState, "have the same root"},
		{"key missing", func(e map[string][]byte) { delete(e, activeKey) }, activeKey, "missing"},
		{"key of another", func(e map[string][]byte) { e[activeKey] = strangerKey }, activeKey, "does not match the public key"},
		{"key not PEM", func(e map[string][]byte) { e[activeKey] = []byte("secret") }, activeKey, "no PEM data"},
		{"key is a certificate", func(e map[string][]byte) {
			e[activeKey] = pemutil.EncodeCertificates(s.Authorities[2].Cert)
		}, activeKey, "want a private key"},
		{"entry nobody names", func(e map[string][]byte) { e["key-0123456789abcdef.pem"] = strangerKey }, "key-0123456789abcdef.pem", "no authority of the CA state refers to it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := encode(t, s)
			tt.edit(e)
			_, err := keymgr.DecodeState(e)
			var ee *keymgr.EntryError
			switch {
			case !errors.As(err, &ee):
				t.Fatalf("err = %v, want an EntryError", err)
			case ee.Entry != tt.wantEntry:
				t.Fatalf("err = %v, names entry %q, want %q", err, ee.Entry, tt.wantEntry)
			case !strings.Contains(err.Error(), tt.want):
				t.Fatalf("err = %v, want %q", err, tt.want)
			case strings.Contains(err.Error(), "PRIVATE KEY"):
				t.Fatalf("err = %v quotes key material", err)
			}
		})
	}
	if _, err := keymgr.DecodeState(nil); err == nil {
		t.Error("DecodeState(nil) succeeded")
	}
}

// chainedIntermediate is a CA certificate that is not self-signed.
func chainedIntermediate(t *testing.T) *x509.Certificate {
	t.Helper()
	return testca.NewRoot(t, "codec root", testca.Options{}).NewIntermediate(t, "codec intermediate", testca.Options{}).Cert
}

func names(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
