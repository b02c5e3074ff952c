package limit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// sleeper is a limiter's sleep on clk: it moves the clock, waiting not.
func sleeper(clk *clock) func(context.Context, time.Duration) error {
	return func(ctx context.Context, d time.Duration) error { clk.add(d); return ctx.Err() }
}

// reasonOf is the reason of err, a refusal of a limit, or "".
func reasonOf(err error) string {
	var e *ExhaustedError
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// review is one review of token from addr under l's failure budget, that
// fails when token is forged; it returns how long its turn was waited for.
func review(l *limiter, clk *clock, addr, token string) (time.Duration, error) {
	start := clk.Now()
	settle, err := l.peerTurn(context.Background(), addr, token, false)
	if err != nil {
		return 0, err
	}
	settle(strings.HasPrefix(token, "forged"))
	return clk.Now().Sub(start), nil
}

// spend has n forged tokens from addr reviewed, one after the other.
func spend(t *testing.T, l *limiter, clk *clock, addr string, n int) {
	t.Helper()
	for i := range n {
		if _, err := review(l, clk, addr, fmt.Sprint("forged-", i)); err != nil {
			t.Fatalf("forged token %d: %v", i+1, err)
		}
	}
}

// TestPeerFailureTurns (issue 22): once an address has spent its failed
// authentications, its reviews wait their turn as the bucket refills,
// from whichever port or form of the address they come; a good token is
// never refused for them, only made to wait, and costs nothing; other
// addresses, however near, never wait. Only a request whose turn comes
// after its deadline is refused, saying when to retry.
func TestPeerFailureTurns(t *testing.T) {
	clk := &clock{now: time.Unix(1e9, 0)}
	l := newLimiter(Limits{PeerFailureRate: 2, PeerFailureBurst: 3}, clk.Now)
	l.sleep = sleeper(clk)
	steps := []struct {
		name, addr, token string
		wait              time.Duration
	}{
		{"successes cost nothing", "192.0.2.7:40000", "good-1", 0},
		{"successes cost nothing", "192.0.2.7:40000", "good-2", 0},
		{"a failure", "192.0.2.7:40000", "forged-1", 0},
		{"a failure", "192.0.2.7:40001", "forged-2", 0},
		{"the last failure of the burst", "192.0.2.7:40002", "forged-3", 0},
		{"a good token waits for the refill", "192.0.2.7:50000", "good-3", 500 * time.Millisecond},
		{"its success gave the token back", "192.0.2.7", "forged-4", 0},
		{"the same address, IPv4-mapped", "[::ffff:192.0.2.7]:1", "forged-5", 500 * time.Millisecond},
		{"another address", "192.0.2.8:40000", "forged-6", 0},
		{"an IPv6 neighbour is another address", "[2001:db8::2]:1", "good-4", 0},
	}
	for _, st := range steps {
		if waited, err := review(l, clk, st.addr, st.token); err != nil || waited != st.wait {
			t.Fatalf("%s (%s): waited %v (%v), want %v", st.name, st.token, waited, err, st.wait)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := l.peerTurn(ctx, "192.0.2.7:1", "good-5", false)
	if reason, after := limitErr(t, err); reason != ReasonPeerAuthnFailures || after != 500*time.Millisecond {
		t.Fatalf("a turn after the deadline: refused with %s after %v, want %s after 500ms", reason, after, ReasonPeerAuthnFailures)
	}
}

// TestPeerTurnHolds: a review in progress holds one of its address's
// failures, so that concurrent requests cannot all count on the same
// ones; a failure spends it, a success gives it back; requests with one
// token share one turn; a lazy request whose address has one free holds
// nothing until it is reviewed.
func TestPeerTurnHolds(t *testing.T) {
	const peer = "192.0.2.7:40000"
	tests := []struct {
		name                       string
		succeeded, failed, holding int
		wait                       time.Duration // of the next turn
		afterHeld                  time.Duration // once the held ones succeed
	}{
		{name: "successes give their failure back", succeeded: 100},
		{name: "one failure left", failed: 1, holding: 1},
		// An address that has not failed is not held to its burst (NAT).
		{name: "many held, none failed", holding: 10},
		{name: "failed and held", failed: 1, holding: 2, wait: 500 * time.Millisecond},
		{name: "spent", failed: 3, wait: 500 * time.Millisecond, afterHeld: 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &clock{now: time.Unix(1e9, 0)}
			l := newLimiter(Limits{PeerFailureRate: 2, PeerFailureBurst: 3}, clk.Now)
			var held []func(bool)
			for i := range tt.succeeded + tt.failed + tt.holding {
				settle, err := l.peerTurn(context.Background(), peer, fmt.Sprint("token-", i), false)
				if err != nil {
					t.Fatalf("turn %d: %v", i+1, err)
				}
				switch {
				case i < tt.succeeded:
					settle(false)
				case i < tt.succeeded+tt.failed:
					settle(true)
				default:
					held = append(held, settle)
				}
			}
			// next: a request with 10 ms left is refused, saying its wait.
			next := func(lazy bool) time.Duration {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
				defer cancel()
				settle, err := l.peerTurn(ctx, peer, "next", lazy)
				switch {
				case err != nil:
					_, after := limitErr(t, err)
					return after
				case lazy && settle != nil:
					t.Fatal("a lazy request held a failure its address had free")
				case settle != nil:
					settle(false)
				}
				return 0
			}
			if got := next(false); got != tt.wait {
				t.Fatalf("next turn in %v, want %v", got, tt.wait)
			}
			if got := next(true); got != tt.wait {
				t.Fatalf("lazily: next turn in %v, want %v", got, tt.wait)
			}
			for _, settle := range held {
				settle(false)
			}
			if got := next(false); got != tt.afterHeld {
				t.Fatalf("once the held ones succeed: next turn in %v, want %v", got, tt.afterHeld)
			}
		})
	}
	t.Run("one token, one turn", func(t *testing.T) {
		clk := &clock{now: time.Unix(1e9, 0)}
		l := newLimiter(Limits{PeerFailureRate: 2, PeerFailureBurst: 3}, clk.Now)
		l.sleep = sleeper(clk)
		spend(t, l, clk, peer, 3)
		var settles []func(bool)
		for i := range 5 { // ztunnel's requests for a node's Pods, one token
			settle, err := l.peerTurn(context.Background(), peer, "forged-same", false)
			if err != nil {
				t.Fatalf("request %d: %v", i+1, err)
			}
			settles = append(settles, settle)
		}
		if waited := clk.Now().Sub(time.Unix(1e9, 0)); waited != 500*time.Millisecond {
			t.Fatalf("5 requests with one token waited %v, want one turn, 500ms", waited)
		}
		for _, settle := range settles {
			settle(true)
		}
		// One failure spent for the five: the next turn is one refill away.
		if waited, err := review(l, clk, peer, "good"); err != nil || waited != 500*time.Millisecond {
			t.Fatalf("next: waited %v (%v), want 500ms", waited, err)
		}
	})
}

// TestFailureFloodBounded (issue 22): a flood of forged tokens from one
// address costs at most its burst of reviews, then its failure rate
// (PeerFailureBurst + PeerFailureRate × the time it lasts), whether its
// requests come one after the other, each waiting its turn, or all at
// once, when only the turns that come before their deadlines are taken;
// after it, a good token from the address is reviewed within one refill.
func TestFailureFloodBounded(t *testing.T) {
	const burst, rate, flood = 100, 10.0, 2000
	const peer = "192.0.2.7:40000"
	t.Run("one after the other", func(t *testing.T) {
		start := time.Unix(1e9, 0)
		clk := &clock{now: start}
		l := newLimiter(Limits{PeerFailureRate: rate, PeerFailureBurst: burst}, clk.Now)
		l.sleep = sleeper(clk)
		spend(t, l, clk, peer, flood)
		elapsed := clk.Now().Sub(start)
		if most := burst + int(rate*elapsed.Seconds()); flood > most {
			t.Fatalf("%d reviews in %v, want at most %d", flood, elapsed, most)
		}
		if waited, err := review(l, clk, peer, "good"); err != nil || waited > time.Second/rate {
			t.Fatalf("a good token after the flood waited %v (%v), want at most %v", waited, err, time.Second/rate)
		}
	})
	t.Run("all at once", func(t *testing.T) {
		clk := &clock{now: time.Unix(1e9, 0)} // stopped: nothing refills
		l := newLimiter(Limits{PeerFailureRate: rate, PeerFailureBurst: burst}, clk.Now)
		l.sleep = func(context.Context, time.Duration) error { return nil }
		spend(t, l, clk, peer, burst)
		const deadline = time.Second
		var reviews, refused atomic.Int64
		var wg sync.WaitGroup
		for i := range flood {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				switch settle, err := l.peerTurn(ctx, peer, fmt.Sprint("forged-at-once-", i), false); {
				case err == nil:
					reviews.Add(1)
					settle(true)
				case reasonOf(err) == ReasonPeerAuthnFailures:
					refused.Add(1)
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if n, most := reviews.Load(), int64(rate*deadline.Seconds()); n > most || refused.Load() != flood-n {
			t.Fatalf("%d reviews and %d refused of %d at once with %v left, want at most %d reviews (%g a second)",
				n, refused.Load(), flood, deadline, most, rate)
		}
	})
}
