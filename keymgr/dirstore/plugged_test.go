package dirstore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TestPluggedDirFollow: a server on a plugged-in CA directory takes an
// intermediate renewed under its root at the next look; refuses one under
// a root it does not serve yet, and a directory caught halfway through a
// change, keeping the last good CA; and takes a new root once the root is
// served beside the old one.
func TestPluggedDirFollow(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	dir := t.TempDir()
	root, next := testca.NewRoot(t, "plugged root", testca.Options{}), testca.NewRoot(t, "next plugged root", testca.Options{})
	first := root.NewIntermediate(t, "issuing 1", testca.Options{})
	first.WriteCACerts(t, dir, root.Cert)
	store := &dirstore.PluggedDir{Dir: dir}
	st, _, err := store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	a, err := keymgr.StateAuthority(st, st.Active().Since())
	if err != nil {
		t.Fatal(err)
	}
	mgr := keymgr.NewManager(td, a)
	f := &keymgr.Follower{Store: store, Target: dirstore.PluggedTarget{Manager: mgr}}
	sync := func(wantChanged bool, wantErr string) uint64 {
		t.Helper()
		changed, err := f.Sync(context.Background())
		switch {
		case wantErr == "" && err != nil:
			t.Fatalf("sync: %v", err)
		case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
			t.Fatalf("sync: err = %v, want %q", err, wantErr)
		case changed != wantChanged:
			t.Fatalf("sync changed = %v, want %v", changed, wantChanged)
		}
		s, _, _ := store.Load(context.Background())
		if s == nil {
			return 0
		}
		return s.Sequence
	}
	signs := func(want *testca.CA, roots int) {
		t.Helper()
		if got := mgr.Authority(); !got.Cert.Equal(want.Cert) || len(got.Roots) != roots {
			t.Fatalf("signing with %q and %d roots, want %q and %d", got.Cert.Subject, len(got.Roots), want.Cert.Subject, roots)
		}
	}
	seq := sync(true, "")
	sync(false, "")
	signs(first, 1)

	second := root.NewIntermediate(t, "issuing 2", testca.Options{})
	second.WriteCACerts(t, dir, root.Cert)
	if s := sync(true, ""); s != seq {
		t.Errorf("sequence %d after a renewal under the same root, want %d: the bundle did not change", s, seq)
	}
	signs(second, 1)

	underNext := next.NewIntermediate(t, "issuing 3", testca.Options{})
	underNext.WriteCACerts(t, dir, next.Cert)
	sync(false, `signs under root "CN=next plugged root`)
	signs(second, 1)

	// Halfway through a change: the new certificate, the old key.
	third := root.NewIntermediate(t, "issuing 4", testca.Options{})
	third.WriteCACerts(t, dir, root.Cert)
	key, err := pemutil.EncodePrivateKey(second.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, keymgr.FileCAKey), key, 0o600); err != nil {
		t.Fatal(err)
	}
	sync(false, "does not match the public key")
	signs(second, 1)

	// The next root served beside the old one, then signing.
	second.WriteCACerts(t, dir, root.Cert, next.Cert)
	if s := sync(true, ""); s <= seq {
		t.Errorf("sequence %d after the bundle grew, want more than %d", s, seq)
	}
	signs(second, 2)
	underNext.WriteCACerts(t, dir, root.Cert, next.Cert)
	sync(true, "")
	signs(underNext, 2)

	if _, err := store.Save(context.Background(), st, ""); !errors.Is(err, dirstore.ErrPluggedReadOnly) {
		t.Fatalf("Save = %v, want ErrPluggedReadOnly", err)
	}
}
