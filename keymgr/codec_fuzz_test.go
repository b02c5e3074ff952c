package keymgr_test

import (
	"math/big"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/storetest"
	"github.com/meshca/meshca/keymgr/upstream"
)

// FuzzDecodeState feeds DecodeState what an editor of the Secret or the
// directory could write: any state.json and any key entry. It must never
// panic, and what it accepts must encode and decode to the same state.
func FuzzDecodeState(f *testing.F) {
	r := storetest.NewRecord(f, keymgr.PhaseActive, time.Now())
	entries, err := keymgr.EncodeState(&keymgr.State{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{r}})
	if err != nil {
		f.Fatal(err)
	}
	keyName := keymgr.KeyEntry(r.Cert)
	f.Add(entries[keymgr.EntryState], entries[keyName], keyName)
	f.Add(entries[keymgr.EntryState], []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), keyName)
	// Format 2: an intermediate's authority, named by its certificate.
	inter := storetest.NewIntermediateRecords(f, time.Now(), keymgr.PhaseActive)[0]
	entries, err = keymgr.EncodeState(&keymgr.State{Sequence: 2, Authorities: []*keymgr.AuthorityRecord{inter}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(entries[keymgr.EntryState], entries[keymgr.KeyEntry(inter.Cert)], keymgr.KeyEntry(inter.Cert))
	// Format 3: an intermediate renewed from an upstream that keeps the
	// root's key, and one from the self upstream, whose root key entry
	// is shared.
	renewed := storetest.NewRenewedRecords(f, time.Now(), upstream.Ref{Type: "vault-transit", Key: "root-1"}, keymgr.PhaseActive)[0]
	entries, err = keymgr.EncodeState(&keymgr.State{Sequence: 3, Authorities: []*keymgr.AuthorityRecord{renewed}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(entries[keymgr.EntryState], entries[keymgr.KeyEntry(renewed.Cert)], keymgr.KeyEntry(renewed.Cert))
	self := storetest.NewRenewedRecords(f, time.Now(), upstream.Ref{Type: "self"}, keymgr.PhaseActive)[0]
	self.Key = nil
	self.External = false
	entries, err = keymgr.EncodeState(&keymgr.State{Sequence: 4, Authorities: []*keymgr.AuthorityRecord{self}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(entries[keymgr.EntryState], entries[keymgr.KeyEntry(self.Root)], keymgr.KeyEntry(self.Root))
	// Format 4: revocations, a node block and a CRL.
	revoked := &keymgr.State{Sequence: 5, Authorities: []*keymgr.AuthorityRecord{r}}
	if _, err := revoked.Revoke([]keymgr.Revocation{{Serial: big.NewInt(0x1f00), Issuer: r.ID(), Reason: 1, RevokedAt: time.Now(), NotAfter: time.Now().Add(time.Hour), Node: "n"}}, time.Now()); err != nil {
		f.Fatal(err)
	}
	revoked.Blocked = []keymgr.NodeBlock{{Node: "n", At: time.Now()}}
	revoked.CRLs = []keymgr.CRLRecord{testCRL(f, r, 1, time.Now(), 0x1f00)}
	entries, err = keymgr.EncodeState(revoked)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(entries[keymgr.EntryState], entries[keyName], keyName)
	f.Add([]byte(`{"format":1,"sequence":3,"authorities":[]}`), []byte(nil), "")
	f.Add([]byte(`{"format":1,"authorities":[{"id":"x","phase":"active","root":"","cert":"","history":[]}]}`), []byte(nil), "key-0000000000000000.pem")
	f.Fuzz(func(t *testing.T, doc, key []byte, name string) {
		in := map[string][]byte{keymgr.EntryState: doc}
		if name != "" && name != keymgr.EntryState {
			in[name] = key
		}
		s, err := keymgr.DecodeState(in)
		if err != nil {
			return
		}
		out, err := keymgr.EncodeState(s)
		if err != nil {
			t.Fatalf("a decoded state does not encode: %v", err)
		}
		again, err := keymgr.DecodeState(out)
		if err != nil {
			t.Fatalf("a re-encoded state does not decode: %v", err)
		}
		if d := storetest.Diff(again, s); d != "" {
			t.Fatalf("re-encoding changed the state: %s", d)
		}
	})
}
