package keymgr_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
)

// custodian is a key-custody upstream that keeps its root keys in a map,
// as a token or Transit keeps them, and destroys them when asked.
type custodian struct {
	*upstream.KeySigned
	mu        sync.Mutex
	keys      map[string]crypto.Signer
	destroyed []string
	signErr   error // SignIntermediate fails with it
	keepErr   error // DestroyRoot fails with it
}

func newCustodian() *custodian {
	c := &custodian{keys: map[string]crypto.Signer{}}
	c.KeySigned = &upstream.KeySigned{Name: "custodian",
		Key: func(_ context.Context, req *upstream.Request) (crypto.Signer, error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.keys[req.Ref.Key], nil
		},
		NewKey: func(_ context.Context, kt certs.KeyType, label string) (crypto.Signer, upstream.Ref, error) {
			key, err := certs.GenerateKey(kt)
			c.mu.Lock()
			defer c.mu.Unlock()
			name := "key-" + string(rune('a'+len(c.keys)))
			c.keys[name] = key
			return key, upstream.Ref{Type: "custodian", Key: name}, err
		}}
	return c
}

func (c *custodian) SignIntermediate(ctx context.Context, req *upstream.Request) (*upstream.Response, error) {
	if c.signErr != nil {
		return nil, c.signErr
	}
	return c.KeySigned.SignIntermediate(ctx, req)
}

func (c *custodian) CheckDestroy(context.Context, *x509.Certificate, upstream.Ref) error { return nil }

func (c *custodian) DestroyRoot(_ context.Context, _ *x509.Certificate, ref upstream.Ref) error {
	if c.keepErr != nil {
		return c.keepErr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.keys, ref.Key)
	c.destroyed = append(c.destroyed, ref.Key)
	return nil
}

func (c *custodian) held() int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.keys) }

// TestNewAuthorityOrphan: a root key made in the upstream whose first
// intermediate then fails is destroyed, or named in the error when the
// upstream keeps it.
func TestNewAuthorityOrphan(t *testing.T) {
	sealed := &upstream.Error{Upstream: "custodian", Kind: upstream.KindUnavailable, Err: errors.New("sealed")}
	for _, c := range []struct {
		name    string
		keepErr error
		left    int
		want    string
	}{
		{"destroyed", nil, 0, "sealed"},
		{"named", errors.New("deletion_allowed is false"), 1, "the new root key key-a in upstream custodian is recorded in no CA state and was not destroyed (deletion_allowed is false)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := newCustodian()
			u.signErr, u.keepErr = sealed, c.keepErr
			r := &keymgr.Renewer{Upstream: u, Name: "custodian", TrustDomain: renewTD, TTL: time.Hour}
			rec, err := r.NewAuthority(t.Context(), keymgr.RootOptions{Organization: "renew.example"})
			if rec != nil || !errors.Is(err, sealed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("NewAuthority = %v, %v; want the upstream's failure saying %q", rec, err, c.want)
			}
			var oe *keymgr.OrphanError
			if (c.keepErr != nil) != errors.As(err, &oe) {
				t.Fatalf("err %v: an *OrphanError %v, want %v", err, oe != nil, c.keepErr != nil)
			}
			if u.held() != c.left {
				t.Fatalf("the upstream holds %d keys, want %d (destroyed %v)", u.held(), c.left, u.destroyed)
			}
		})
	}
}

// conflicting is a store whose first Save loses its compare-and-swap, as
// when another replica wrote in between.
type conflicting struct {
	keymgr.StateStore
	once sync.Once
}

func (c *conflicting) Save(ctx context.Context, s *keymgr.State, base keymgr.Version) (keymgr.Version, error) {
	lost := false
	c.once.Do(func() { lost = true })
	if lost {
		return "", keymgr.ErrConflict
	}
	return c.StateStore.Save(ctx, s, base)
}

// TestLoadOrBootstrapOrphan: a first start makes its root in the
// upstream once, whatever compare-and-swaps it loses, and destroys it
// when another replica bootstrapped the state first.
func TestLoadOrBootstrapOrphan(t *testing.T) {
	t.Run("a lost compare-and-swap makes no second root", func(t *testing.T) {
		u := newCustodian()
		r := &keymgr.Renewer{Upstream: u, Name: "custodian", TrustDomain: renewTD, TTL: time.Hour}
		store := &conflicting{StateStore: &codecStore{}}
		st, err := keymgr.LoadOrBootstrap(t.Context(), store, func() (*keymgr.AuthorityRecord, error) {
			return r.NewAuthority(t.Context(), keymgr.RootOptions{Organization: "renew.example"})
		}, time.Now())
		if err != nil || st.Active() == nil {
			t.Fatal(err)
		}
		if u.held() != 1 {
			t.Fatalf("the upstream holds %d root keys after one first start, want 1: a retry made another", u.held())
		}
	})
	t.Run("another replica first", func(t *testing.T) {
		u := newCustodian()
		r := &keymgr.Renewer{Upstream: u, Name: "custodian", TrustDomain: renewTD, TTL: time.Hour}
		store := &codecStore{}
		gen := func() (*keymgr.AuthorityRecord, error) {
			return r.NewAuthority(t.Context(), keymgr.RootOptions{Organization: "renew.example"})
		}
		var winner *keymgr.State
		st, err := keymgr.LoadOrBootstrapDiscarding(t.Context(), store, func() (*keymgr.AuthorityRecord, error) {
			rec, err := gen()
			if err != nil {
				return nil, err
			}
			// The other replica stores its own while this one made its root.
			if winner, err = keymgr.LoadOrBootstrap(t.Context(), store, gen, time.Now()); err != nil {
				return nil, err
			}
			return rec, nil
		}, func(made *keymgr.AuthorityRecord) error {
			_, err := r.Discard(t.Context(), made)
			return err
		}, time.Now())
		if err != nil || !st.Active().Cert.Equal(winner.Active().Cert) {
			t.Fatalf("the state is not the winner's: %v", err)
		}
		if u.held() != 1 || len(u.destroyed) != 1 {
			t.Fatalf("the upstream holds %d root keys and destroyed %v; want the winner's alone", u.held(), u.destroyed)
		}
	})
}

// lostAnswer is a store whose first Save is stored but answers an error,
// as a write whose response a timeout cut.
type lostAnswer struct {
	keymgr.StateStore
	once sync.Once
}

func (l *lostAnswer) Save(ctx context.Context, s *keymgr.State, base keymgr.Version) (keymgr.Version, error) {
	v, err := l.StateStore.Save(ctx, s, base)
	lost := false
	l.once.Do(func() { lost = true })
	if lost && err == nil {
		return "", context.DeadlineExceeded
	}
	return v, err
}

// TestLoadOrBootstrapLostAnswer: a bootstrap that was stored though its
// update failed keeps its root key: the state, read again, holds it.
func TestLoadOrBootstrapLostAnswer(t *testing.T) {
	u := newCustodian()
	r := &keymgr.Renewer{Upstream: u, Name: "custodian", TrustDomain: renewTD, TTL: time.Hour}
	store := &lostAnswer{StateStore: &codecStore{}}
	discarded := 0
	_, err := keymgr.LoadOrBootstrapDiscarding(t.Context(), store, func() (*keymgr.AuthorityRecord, error) {
		return r.NewAuthority(t.Context(), keymgr.RootOptions{Organization: "renew.example"})
	}, func(*keymgr.AuthorityRecord) error { discarded++; return nil }, time.Now())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the lost answer", err)
	}
	st, _, lerr := store.Load(t.Context())
	if lerr != nil || st.Active() == nil || discarded != 0 || u.held() != 1 {
		t.Fatalf("stored %v (%v), discarded %d times, the upstream holds %d keys: the stored root's key must stay", st != nil && st.Active() != nil, lerr, discarded, u.held())
	}
}
