package keymgr_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/storetest"
	"github.com/meshca/meshca/keymgr/upstream"
)

// upstreamState is a root that signed by itself (previous), and two
// intermediates renewed under it from the self upstream, previous and
// active, which share the root's key.
func upstreamState(t *testing.T) *keymgr.State {
	t.Helper()
	at := time.Now().Add(-time.Hour)
	rs := storetest.NewRenewedRecords(t, at, upstream.Ref{Type: "self"}, keymgr.PhasePrevious, keymgr.PhaseActive)
	root := &keymgr.AuthorityRecord{Phase: keymgr.PhasePrevious, Root: rs[0].Root, Cert: rs[0].Root, Key: rs[0].RootKey, Generated: true,
		History: []keymgr.Transition{{To: keymgr.PhasePrepared, At: at}, {To: keymgr.PhaseActive, At: at}, {To: keymgr.PhasePrevious, At: at}}}
	return &keymgr.State{Sequence: 1, Authorities: append([]*keymgr.AuthorityRecord{root}, rs...)}
}

// TestStateCodecUpstream: format 3 keeps each authority's upstream, and
// one entry for the root's key, which the authority signing with the
// root itself names too.
func TestStateCodecUpstream(t *testing.T) {
	s := upstreamState(t)
	entries := encode(t, s)
	var doc struct {
		Format      int
		Authorities []struct {
			Key, RootKey string
			Upstream     *upstream.Ref
		}
	}
	if err := json.Unmarshal(entries[keymgr.EntryState], &doc); err != nil {
		t.Fatal(err)
	}
	rootEntry := keymgr.KeyEntry(s.Authorities[0].Root)
	switch {
	case doc.Format != 3:
		t.Fatalf("format %d, want 3", doc.Format)
	case len(entries) != 4:
		t.Fatalf("entries %v, want the document, the root's key and two intermediates' keys", names(entries))
	case doc.Authorities[0].Key != rootEntry || doc.Authorities[0].Upstream != nil:
		t.Fatalf("the root's own authority: %+v", doc.Authorities[0])
	case doc.Authorities[2].RootKey != rootEntry || doc.Authorities[2].Upstream == nil || doc.Authorities[2].Upstream.Type != "self":
		t.Fatalf("the renewed authority: %+v", doc.Authorities[2])
	}
	got, err := keymgr.DecodeState(entries)
	if err != nil {
		t.Fatal(err)
	}
	if d := storetest.Diff(got, s); d != "" {
		t.Fatal(d)
	}
	if got.Authorities[1].RootKey != got.Authorities[2].RootKey || got.Authorities[0].Key != got.Authorities[2].RootKey {
		t.Error("the authorities under one root do not share its decoded key")
	}
}

func TestDecodeStateRefusesUpstream(t *testing.T) {
	s := upstreamState(t)
	other := upstreamState(t)
	rootEntry := keymgr.KeyEntry(s.Authorities[0].Root)
	edit := func(i int, k string, v any) func(map[string][]byte) {
		return func(e map[string][]byte) {
			var d map[string]any
			if err := json.Unmarshal(e[keymgr.EntryState], &d); err != nil {
				t.Fatal(err)
			}
			a := d["authorities"].([]any)[i].(map[string]any)
			switch {
			case k == "format":
				d["format"] = v
			case v == nil:
				delete(a, k)
			default:
				a[k] = v
			}
			b, _ := json.Marshal(d)
			e[keymgr.EntryState] = b
		}
	}
	tests := []struct {
		name      string
		edit      func(map[string][]byte)
		wantEntry string
		want      string
	}{
		{"format 2 with an upstream", edit(2, "format", 2), keymgr.EntryState, "upstream and rootKey are fields of format 3, not 2"},
		{"an upstream without a type", edit(2, "upstream", map[string]any{"key": "x"}), keymgr.EntryState, "upstream: the type is empty"},
		{"an unknown upstream field", edit(2, "upstream", map[string]any{"type": "self", "pin": "1234"}), keymgr.EntryState, `unknown field "pin"`},
		{"a root key misnamed", edit(2, "rootKey", keymgr.KeyEntry(s.Authorities[2].Cert)), keymgr.EntryState, "is not the one named for its root"},
		{"a retired authority's root key", func(e map[string][]byte) {
			edit(1, "phase", "retired")(e)
			edit(1, "key", nil)(e)
			var d map[string]any
			_ = json.Unmarshal(e[keymgr.EntryState], &d)
			h := d["authorities"].([]any)[1].(map[string]any)["history"].([]any)
			d["authorities"].([]any)[1].(map[string]any)["history"] = append(h, map[string]any{"to": "retired", "at": time.Now().UTC().Format(time.RFC3339)})
			b, _ := json.Marshal(d)
			e[keymgr.EntryState] = b
			delete(e, keymgr.KeyEntry(s.Authorities[1].Cert))
		}, keymgr.EntryState, "a retired authority has a key entry"},
		{"the root key of another root", func(e map[string][]byte) {
			e[rootEntry] = encode(t, other)[keymgr.KeyEntry(other.Authorities[0].Root)]
		}, rootEntry, "does not match the public key"},
		{"a root key without its upstream", edit(2, "upstream", nil), keymgr.EntryState, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := encode(t, s)
			tt.edit(e)
			got, err := keymgr.DecodeState(e)
			if tt.want == "" {
				// The codec reads it; the state's rules refuse it.
				if err == nil {
					err = got.Validate()
				}
				if err == nil || !strings.Contains(err.Error(), "keeps a root key only for the upstream") {
					t.Fatalf("err = %v, want the state refused", err)
				}
				return
			}
			var ee *keymgr.EntryError
			switch {
			case !errors.As(err, &ee):
				t.Fatalf("err = %v, want an EntryError", err)
			case ee.Entry != tt.wantEntry:
				t.Fatalf("err = %v, names entry %q, want %q", err, ee.Entry, tt.wantEntry)
			case !strings.Contains(err.Error(), tt.want):
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}
