package secretstore_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/secretstore"
	"github.com/meshca/meshca/keymgr/storetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
)

// FuzzLoad feeds the state Secret (meshca serve --state-secret) what
// anyone allowed to edit it could write: any state.json entry and any two
// other entries an apiserver accepts, through Store.Load. It must never
// panic. A Secret without data is keymgr.ErrNoState; any other refusal
// names the Secret and never quotes a key entry's content. A state it
// loads saves back into the same Secret and loads again unchanged.
func FuzzLoad(f *testing.F) {
	at := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	retired := storetest.NewRecord(f, keymgr.PhaseRetired, at.Add(-time.Hour))
	retired.Key = nil
	previous := storetest.NewRecord(f, keymgr.PhasePrevious, at)
	active := storetest.NewRecord(f, keymgr.PhaseActive, at)
	active.LongestLeafTTL, active.LatestLeafNotAfter = 24*time.Hour, at.Add(24*time.Hour)
	entries, err := keymgr.EncodeState(&keymgr.State{Sequence: 3, Authorities: []*keymgr.AuthorityRecord{retired, previous, active}})
	if err != nil {
		f.Fatal(err)
	}
	doc := entries[keymgr.EntryState]
	prevKey, activeKey := keymgr.KeyEntry(previous.Cert), keymgr.KeyEntry(active.Cert)
	f.Add(doc, prevKey, entries[prevKey], activeKey, entries[activeKey])
	f.Add(doc, prevKey, entries[activeKey], activeKey, entries[prevKey])
	f.Add(doc, prevKey, entries[prevKey], "ca-key.pem", entries[activeKey])
	f.Add([]byte(`{"format":1,"sequence":1,"authorities":[]}`), "", []byte(nil), "", []byte(nil))
	f.Add([]byte(nil), "", []byte(nil), "", []byte(nil))
	f.Add([]byte(nil), activeKey, entries[activeKey], "", []byte(nil))

	const ns, name = "istio-system", "meshca-ca"
	f.Fuzz(func(t *testing.T, doc []byte, name1 string, key1 []byte, name2 string, key2 []byte) {
		data := map[string][]byte{}
		if len(doc) > 0 {
			data[keymgr.EntryState] = doc
		}
		for _, e := range []struct {
			name  string
			value []byte
		}{{name1, key1}, {name2, key2}} {
			if len(validation.IsConfigMapKey(e.name)) == 0 {
				data[e.name] = e.value
			}
		}
		client := fake.NewClientset(&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "42"},
			Type:       corev1.SecretTypeOpaque,
			Data:       data,
		})
		st := secretstore.Store{Client: client, Namespace: ns, Name: name}
		ctx := context.Background()
		s, v, err := st.Load(ctx)
		if err != nil {
			if s != nil || v != "" {
				t.Fatalf("Load returned a state or version along with %v", err)
			}
			if len(data) == 0 {
				if !errors.Is(err, keymgr.ErrNoState) {
					t.Fatalf("a Secret without data: %v, want ErrNoState", err)
				}
				return
			}
			if !strings.HasPrefix(err.Error(), "secretstore: Secret "+ns+"/"+name+": ") {
				t.Fatalf("error %q does not name the Secret", err)
			}
			for entry, value := range data {
				if entry != keymgr.EntryState {
					requireNotQuoted(t, err.Error(), value, doc, name1+"\n"+name2)
				}
			}
			return
		}
		if len(data) == 0 {
			t.Fatal("a Secret without data loaded")
		}
		if v != "42" {
			t.Fatalf("Version = %q, want the Secret's resourceVersion", v)
		}
		if _, err := st.Save(ctx, s, v); err != nil {
			t.Fatalf("a loaded state does not save back: %v", err)
		}
		again, _, err := st.Load(ctx)
		if err != nil {
			t.Fatalf("a saved state does not load: %v", err)
		}
		if d := storetest.Diff(again, s); d != "" {
			t.Fatalf("saving a loaded state changed it: %s", d)
		}
	})
}

// requireNotQuoted fails if msg holds a line of a key entry's value long
// enough to be key material, unless the line also appears in the state
// document or the entry names, which are not secret.
func requireNotQuoted(t *testing.T, msg string, value, doc []byte, names string) {
	t.Helper()
	for _, line := range bytes.Split(value, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) < 24 || bytes.HasPrefix(line, []byte("-----")) || bytes.Contains(doc, line) || strings.Contains(names, string(line)) {
			continue
		}
		if strings.Contains(msg, string(line)) {
			t.Fatalf("error %q quotes a key entry's content", msg)
		}
	}
}
