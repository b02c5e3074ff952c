package keymgr_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
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
	store := &keymgr.PluggedDir{Dir: dir}
	st, _, err := store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	a, err := keymgr.StateAuthority(st, st.Active().Since())
	if err != nil {
		t.Fatal(err)
	}
	mgr := keymgr.NewManager(td, a)
	f := &keymgr.Follower{Store: store, Target: keymgr.PluggedTarget{Manager: mgr}}
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

	if _, err := store.Save(context.Background(), st, ""); !errors.Is(err, keymgr.ErrPluggedReadOnly) {
		t.Fatalf("Save = %v, want ErrPluggedReadOnly", err)
	}
}

// flakyStore is a StateStore whose Load fails with err while it is set.
type flakyStore struct {
	mu    sync.Mutex
	err   error
	state *keymgr.State
	loads int
}

func (f *flakyStore) set(err error) { f.mu.Lock(); f.err = err; f.mu.Unlock() }

func (f *flakyStore) Load(context.Context) (*keymgr.State, keymgr.Version, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads++
	if f.err != nil {
		return nil, "", f.err
	}
	return f.state, "v1", nil
}

func (f *flakyStore) Save(context.Context, *keymgr.State, keymgr.Version) (keymgr.Version, error) {
	return "", errors.New("read-only")
}

func (f *flakyStore) looks() int { f.mu.Lock(); defer f.mu.Unlock(); return f.loads }

// TestFollowerReportsOnce: a store that stays broken is reported once,
// not at every look; once it is whole and broken again, again.
func TestFollowerReportsOnce(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	root := testca.NewRoot(t, "root", testca.Options{})
	a := root.Authority()
	st := &keymgr.State{}
	if err := st.Bootstrap(&keymgr.AuthorityRecord{Root: root.Cert, Cert: root.Cert, Key: root.Key}, time.Now(), ""); err != nil {
		t.Fatal(err)
	}
	store := &flakyStore{state: st, err: errors.New("broken")}
	var mu sync.Mutex
	reports := 0
	f := &keymgr.Follower{Store: store, Target: keymgr.NewManager(td, a), Interval: time.Millisecond,
		OnError: func(error) { mu.Lock(); reports++; mu.Unlock() }}
	reported := func() int { mu.Lock(); defer mu.Unlock(); return reports }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = f.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, func() bool { return store.looks() > 10 })
	if n := reported(); n != 1 {
		t.Fatalf("reported %d times over %d looks, want once", n, store.looks())
	}
	store.set(nil)
	n := store.looks()
	waitFor(t, func() bool { return store.looks() > n+2 })
	store.set(errors.New("broken"))
	waitFor(t, func() bool { return reported() == 2 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
	}
}

func TestCAKeyRule(t *testing.T) {
	tests := []struct {
		name string
		key  func() (crypto.PublicKey, error)
		want string
	}{
		{"P-256", func() (crypto.PublicKey, error) {
			k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			return k.Public(), err
		}, ""},
		{"P-224", func() (crypto.PublicKey, error) {
			k, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
			return k.Public(), err
		}, "curve P-224"},
		{"RSA-1024", func() (crypto.PublicKey, error) { k, err := rsa.GenerateKey(rand.Reader, 1024); return k.Public(), err }, "has 1024 bits"},
		{"RSA-2048", func() (crypto.PublicKey, error) { k, err := rsa.GenerateKey(rand.Reader, 2048); return k.Public(), err }, ""},
		{"Ed25519", func() (crypto.PublicKey, error) { p, _, err := ed25519.GenerateKey(rand.Reader); return p, err }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub, err := tt.key()
			if err != nil {
				t.Fatal(err)
			}
			got := keymgr.CAKeyRule(pub)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Fatalf("CAKeyRule = %q, want %q", got, tt.want)
			}
		})
	}
}
