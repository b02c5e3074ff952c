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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

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
