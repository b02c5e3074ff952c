package kube

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingReviewer is a pure in-memory stand-in for TokenReview.
type countingReviewer struct {
	calls       atomic.Int64
	delay       time.Duration
	fail        bool
	unavailable bool
	// gate, when set, holds every review until it is closed.
	gate chan struct{}
}

func (c *countingReviewer) Review(_ context.Context, token string) (*Identity, error) {
	c.calls.Add(1)
	time.Sleep(c.delay)
	if c.gate != nil {
		<-c.gate
	}
	switch {
	case c.unavailable:
		return nil, unavailable("tokenreview_failed", "later", nil)
	case c.fail:
		return nil, refused("token_invalid", "no", nil)
	}
	return &Identity{Namespace: "istio-system", ServiceAccount: "ztunnel", PodUID: "uid-" + token[:1]}, nil
}

func jwtWithExp(exp time.Time) string {
	p := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"exp":%d}`, exp.Unix())))
	return "a." + p + ".sig"
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (f *fakeClock) Now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }
func (f *fakeClock) Add(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

func TestTokenCache(t *testing.T) {
	clock := &fakeClock{now: time.Now()}
	newCache := func(inner *countingReviewer, size int) *CachedTokenReviewer {
		return NewCachedTokenReviewer(TokenCacheConfig{Reviewer: inner, Audiences: []string{"istio-ca"}, TTL: time.Minute, MaxEntries: size, Now: clock.Now})
	}
	auth := func(t *testing.T, c *CachedTokenReviewer, tok string) error {
		t.Helper()
		_, err := c.Review(context.Background(), tok)
		return err
	}
	t.Run("reuses a positive review until the ceiling", func(t *testing.T) {
		inner := &countingReviewer{}
		c := newCache(inner, 10)
		tok := jwtWithExp(clock.Now().Add(time.Hour))
		for range 100 {
			if err := auth(t, c, tok); err != nil {
				t.Fatal(err)
			}
		}
		clock.Add(61 * time.Second)
		_ = auth(t, c, tok)
		if n := inner.calls.Load(); n != 2 {
			t.Fatalf("%d reviews, want 2", n)
		}
	})
	t.Run("never past the token's expiry", func(t *testing.T) {
		inner := &countingReviewer{}
		c := newCache(inner, 10)
		tok := jwtWithExp(clock.Now().Add(10 * time.Second))
		_ = auth(t, c, tok)
		clock.Add(11 * time.Second)
		_ = auth(t, c, tok)
		if n := inner.calls.Load(); n != 2 {
			t.Fatalf("%d reviews, want 2", n)
		}
	})
	t.Run("refusals are cached briefly", func(t *testing.T) {
		inner := &countingReviewer{fail: true}
		c := newCache(inner, 10)
		for range 100 {
			if err := auth(t, c, "bad"); !isRefusal(err) {
				t.Fatalf("err = %v, want the cached refusal", err)
			}
		}
		if n := inner.calls.Load(); n != 1 || c.Len() != 0 {
			t.Fatalf("%d reviews and %d positive entries, want 1 and 0", n, c.Len())
		}
		clock.Add(DefaultNegativeTTL + time.Second)
		_ = auth(t, c, "bad")
		if n := inner.calls.Load(); n != 2 {
			t.Fatalf("%d reviews after the negative TTL, want 2", n)
		}
	})
	t.Run("unavailable is never cached", func(t *testing.T) {
		inner := &countingReviewer{unavailable: true}
		c := newCache(inner, 10)
		for range 3 {
			if err := auth(t, c, "any"); isRefusal(err) || err == nil {
				t.Fatalf("err = %v, want Unavailable", err)
			}
		}
		if n := inner.calls.Load(); n != 3 {
			t.Fatalf("%d reviews, want 3", n)
		}
	})
	t.Run("refusals are bounded", func(t *testing.T) {
		inner := &countingReviewer{fail: true}
		c := newCache(inner, 10)
		for i := range maxNegative + 500 {
			_ = auth(t, c, fmt.Sprint("bad-", i))
		}
		c.mu.Lock()
		n, q := len(c.refused), c.fifo.Len()
		c.mu.Unlock()
		if n > maxNegative || q > maxNegative {
			t.Fatalf("%d refusals kept (%d queued), want at most %d", n, q, maxNegative)
		}
	})
	t.Run("a review in flight when its pod goes is refused", func(t *testing.T) {
		inner := &countingReviewer{gate: make(chan struct{})}
		c := newCache(inner, 10)
		tok := "g" + jwtWithExp(clock.Now().Add(time.Hour))
		done := make(chan error)
		go func() { done <- auth(t, c, tok) }()
		for inner.calls.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		c.InvalidatePod("uid-g") // the Pod is deleted while the review runs
		close(inner.gate)
		wantGone(t, <-done)
		if c.Len() != 0 {
			t.Fatalf("%d entries: the stale review was stored after the invalidation", c.Len())
		}
		wantGone(t, auth(t, c, tok))
		if n := inner.calls.Load(); n != 1 {
			t.Fatalf("%d reviews, want 1 (the refusal is remembered)", n)
		}
	})
	t.Run("concurrent misses share one review", func(t *testing.T) {
		inner := &countingReviewer{delay: 50 * time.Millisecond}
		c := newCache(inner, 10)
		tok := jwtWithExp(clock.Now().Add(time.Hour))
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() { _ = auth(t, c, tok) })
		}
		wg.Wait()
		if n := inner.calls.Load(); n != 1 {
			t.Fatalf("%d reviews, want 1", n)
		}
	})
	t.Run("a waiter stops at its own deadline, the shared review goes on", func(t *testing.T) {
		inner := &countingReviewer{gate: make(chan struct{})}
		c := newCache(inner, 10)
		tok := "w" + jwtWithExp(clock.Now().Add(time.Hour))
		patient := make(chan error)
		go func() { patient <- auth(t, c, tok) }()
		for inner.calls.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := c.Review(ctx, tok)
		var ke *Error
		if !errors.As(err, &ke) || !ke.Retry || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want a retryable error wrapping the deadline", err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("the waiter returned after %v, long past its 50ms deadline", took)
		}
		close(inner.gate)
		if err := <-patient; err != nil {
			t.Fatalf("the caller without a deadline: %v", err)
		}
		if n := inner.calls.Load(); n != 1 {
			t.Fatalf("%d reviews, want 1 shared", n)
		}
	})
	t.Run("bounded, least recently used goes first", func(t *testing.T) {
		inner := &countingReviewer{}
		c := newCache(inner, 2)
		a, b, d := "a"+jwtWithExp(clock.Now().Add(time.Hour)), "b"+jwtWithExp(clock.Now().Add(time.Hour)), "d"+jwtWithExp(clock.Now().Add(time.Hour))
		_, _, _ = auth(t, c, a), auth(t, c, b), auth(t, c, a)
		_ = auth(t, c, d) // evicts b
		if c.Len() != 2 {
			t.Fatalf("%d entries, want 2", c.Len())
		}
		before := inner.calls.Load()
		_ = auth(t, c, a)
		_ = auth(t, c, b)
		if got := inner.calls.Load() - before; got != 1 {
			t.Fatalf("%d reviews after eviction, want 1 (only b)", got)
		}
	})
	t.Run("pod deletion invalidates", func(t *testing.T) {
		inner := &countingReviewer{}
		c := newCache(inner, 10)
		tok := "x" + jwtWithExp(clock.Now().Add(time.Hour))
		if err := auth(t, c, tok); err != nil {
			t.Fatal(err)
		}
		c.InvalidatePod("uid-x")
		// The apiserver has not seen the deletion and still accepts the
		// token: it is refused, not cached again for the TTL.
		wantGone(t, auth(t, c, tok))
		clock.Add(50 * time.Second)
		wantGone(t, auth(t, c, tok))
		if n := inner.calls.Load(); n != 3 {
			t.Fatalf("%d reviews, want 3 (one a NegativeTTL)", n)
		}
		if c.Len() != 0 {
			t.Fatalf("%d entries, want none for the deleted Pod's token", c.Len())
		}
		if err := auth(t, c, "y"+jwtWithExp(clock.Now().Add(time.Hour))); err != nil {
			t.Fatalf("another Pod's token: %v", err)
		}
	})
	t.Run("a tombstone lasts goneFor, and is pruned at the next deletion", func(t *testing.T) {
		inner := &countingReviewer{}
		c := newCache(inner, 10)
		tok := "o" + jwtWithExp(clock.Now().Add(time.Hour))
		c.InvalidatePod("uid-o")
		clock.Add(c.goneFor() + time.Second)
		if err := auth(t, c, tok); err != nil {
			t.Fatalf("a token of a Pod deleted longer than goneFor ago, the apiserver accepting it: %v", err)
		}
		c.InvalidatePod("uid-new")
		c.mu.Lock()
		_, old := c.gone["uid-o"]
		_, recent := c.gone["uid-new"]
		n := c.goneOrder.Len()
		c.mu.Unlock()
		if old || !recent || n != 1 {
			t.Fatalf("tombstones: old %v, new %v, %d queued; want only the new one", old, recent, n)
		}
	})
}

// TestTokenCacheKnown: Known is true only for a token whose positive
// review is cached and unexpired; it never reviews.
func TestTokenCacheKnown(t *testing.T) {
	clock := &fakeClock{now: time.Now()}
	good, bad := &countingReviewer{}, &countingReviewer{fail: true}
	tok := jwtWithExp(clock.Now().Add(time.Hour))
	tests := []struct {
		name   string
		inner  *countingReviewer
		review bool
		after  time.Duration
		want   bool
	}{
		{name: "never reviewed", inner: good},
		{name: "reviewed", inner: good, review: true, want: true},
		{name: "reviewed, past the cache's TTL", inner: good, review: true, after: 61 * time.Second},
		{name: "refused", inner: bad, review: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCachedTokenReviewer(TokenCacheConfig{Reviewer: tt.inner, Audiences: []string{"istio-ca"}, TTL: time.Minute, Now: clock.Now})
			if tt.review {
				_, _ = c.Review(context.Background(), tok)
			}
			clock.Add(tt.after)
			before := tt.inner.calls.Load()
			if got := c.Known(tok); got != tt.want {
				t.Errorf("Known = %v, want %v", got, tt.want)
			}
			if tt.inner.calls.Load() != before {
				t.Error("Known asked for a review")
			}
		})
	}
}

// wantGone: err is the refusal of a token whose Pod was deleted.
func wantGone(t *testing.T, err error) {
	t.Helper()
	var ke *Error
	if !errors.As(err, &ke) || ke.Retry || ke.Reason != "token_bound_object_gone" || ke.Msg != tokenMsg {
		t.Fatalf("got %v, want the refusal token_bound_object_gone", err)
	}
}
