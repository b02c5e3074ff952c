package keymgr_test

import (
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/storetest"
)

// revokedState is codecState with revocations, a node block and a CRL.
func revokedState(t *testing.T) *keymgr.State {
	t.Helper()
	now := time.Now()
	s := codecState(t)
	active := s.Authorities[2]
	r := rev(0x1f00, active.ID(), now)
	r.Node, r.Reason = "node-a", 0
	if _, err := s.Revoke([]keymgr.Revocation{r, rev(2, "", now)}, now); err != nil {
		t.Fatal(err)
	}
	s.Blocked = []keymgr.NodeBlock{{Node: "node-a", Since: now.Add(-time.Hour), At: now, Reason: "stolen", By: "alice"}, {Node: "node-b", At: now}}
	s.CRLs = []keymgr.CRLRecord{testCRL(t, active, 12, now, 0x1f00, 2)}
	return s
}

func TestStateCodecRevocations(t *testing.T) {
	s := revokedState(t)
	entries := encode(t, s)
	var doc struct {
		Format      int              `json:"format"`
		Revocations []map[string]any `json:"revocations"`
		CRLs        []map[string]any `json:"crls"`
	}
	if err := json.Unmarshal(entries[keymgr.EntryState], &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Format != 4 || len(doc.Revocations) != 2 || doc.Revocations[0]["serial"] != "1f00" || len(doc.CRLs) != 1 {
		t.Fatalf("document %+v, want format 4 with serial 1f00 and one CRL", doc)
	}
	if !strings.HasPrefix(doc.CRLs[0]["crl"].(string), "-----BEGIN X509 CRL-----\n") {
		t.Fatalf("the CRL is not PEM: %q", doc.CRLs[0]["crl"])
	}
	got, err := keymgr.DecodeState(entries)
	if err != nil {
		t.Fatal(err)
	}
	if d := storetest.Diff(got, s); d != "" {
		t.Fatal(d)
	}
	if c := got.CRLs[0]; c.Number.Int64() != 12 || !c.NextUpdate.Equal(s.CRLs[0].NextUpdate) {
		t.Fatalf("decoded CRL record %+v", c)
	}
	// Without revocations, blocks and CRLs the state keeps its older
	// format, so an older meshca still reads it.
	s.Revocations, s.Blocked, s.CRLs = nil, nil, nil
	if err := json.Unmarshal(encode(t, s)[keymgr.EntryState], &doc); err != nil || doc.Format != 1 {
		t.Fatalf("format %d (%v), want 1 without revocations", doc.Format, err)
	}
}

func TestDecodeStateRefusesRevocations(t *testing.T) {
	s := revokedState(t)
	edit := func(list string, k string, v any) func(map[string][]byte) {
		return func(e map[string][]byte) {
			var d map[string]any
			if err := json.Unmarshal(e[keymgr.EntryState], &d); err != nil {
				t.Fatal(err)
			}
			if list == "" {
				d[k] = v
			} else {
				d[list].([]any)[0].(map[string]any)[k] = v
			}
			b, _ := json.Marshal(d)
			e[keymgr.EntryState] = b
		}
	}
	other := storetest.NewRecord(t, keymgr.PhaseActive, time.Now())
	otherCRL := testCRL(t, other, 1, time.Now())
	tests := []struct {
		name string
		edit func(map[string][]byte)
		want string
	}{
		{"format 3 with revocations", edit("", "format", 3), "revocations, blocked and crls are fields of format 4, not 3"},
		{"unknown revocation field", edit("revocations", "hold", true), `the document.revocations[0] has the unknown field "hold"`},
		{"serial with 0x", edit("revocations", "serial", "0x1f00"), `revocation 1: serial "0x1f00" is not lowercase hex`},
		{"serial uppercase", edit("revocations", "serial", "1F00"), `serial "1F00" is not lowercase hex`},
		{"serial with a leading zero", edit("revocations", "serial", "01f00"), `serial "01f00" is not lowercase hex`},
		{"serial 0", edit("revocations", "serial", "0"), "revocation 1: the serial number must be positive"},
		{"reason 7", edit("revocations", "reason", 7), "revocation 1: reason 7"},
		{"bad time", edit("revocations", "notAfter", "tomorrow"), `revocation 1: notAfter: time "tomorrow" is not RFC 3339`},
		{"no notAfter", edit("revocations", "notAfter", ""), "revocation 1: notAfter"},
		{"bad issuer", edit("revocations", "issuer", "ABC"), `issuer "ABC" is not a hex SHA-256 fingerprint`},
		{"block without time", edit("blocked", "at", ""), "node block 1: at:"},
		{"block without node", edit("blocked", "node", ""), "node block 1: node name"},
		{"block twice", edit("blocked", "node", "node-b"), `node "node-b" is blocked twice`},
		{"CRL not PEM", edit("crls", "crl", "junk"), `crl: not a PEM "X509 CRL" block`},
		{"CRL as a certificate", edit("crls", "crl", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), `not a PEM "X509 CRL" block`},
		{"CRL that does not parse", edit("crls", "crl", "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"), "crl: the CRL does not parse"},
		{"two CRLs", func(e map[string][]byte) {
			edit("crls", "crl", string(s.View().CRLBundlePEM())+string(s.View().CRLBundlePEM()))(e)
		}, "crl: data follows the PEM block"},
		{"CRL issuer not a fingerprint", edit("crls", "issuer", "zz"), `issuer "zz" is not a hex SHA-256 fingerprint`},
		{"unknown CRL field", edit("crls", "number", 3), `unknown field "number"`},
		{"two CRLs of one issuer", edit("", "crls", []any{
			map[string]any{"issuer": s.CRLs[0].Issuer, "crl": string(s.View().CRLBundlePEM())},
			map[string]any{"issuer": s.CRLs[0].Issuer, "crl": string((&keymgr.State{CRLs: []keymgr.CRLRecord{otherCRL}}).View().CRLBundlePEM())},
		}), "two CRLs of the same issuer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := encode(t, s)
			tt.edit(e)
			_, err := keymgr.DecodeState(e)
			var ee *keymgr.EntryError
			if !errors.As(err, &ee) || ee.Entry != keymgr.EntryState || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want an EntryError of %s with %q", err, keymgr.EntryState, tt.want)
			}
		})
	}
}

func TestEncodeStateRefusesRevocations(t *testing.T) {
	s := revokedState(t)
	s.Revocations = append(s.Revocations, keymgr.Revocation{Serial: big.NewInt(-1), RevokedAt: time.Now(), NotAfter: time.Now()})
	if _, err := keymgr.EncodeState(s); err == nil || !strings.Contains(err.Error(), "the serial number must be positive") {
		t.Fatalf("EncodeState of a negative serial: err = %v", err)
	}
}
