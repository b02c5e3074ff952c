package limit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is an injected clock the tests move by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

func workload(ns, sa string) Caller {
	return Caller{ID: "spiffe://cluster.local/ns/" + ns + "/sa/" + sa}
}

// ztunnel is a Pod of istio-system/ztunnel, a trusted node account of
// the cluster Kubernetes.
func ztunnel(pod string) Caller {
	c := workload("istio-system", "ztunnel")
	c.NodeProxy, c.Pod = true, "Kubernetes/istio-system/"+pod
	return c
}

// limitErr returns err's reason and retry hint, failing unless it is a
// *ExhaustedError.
func limitErr(t *testing.T, err error) (string, time.Duration) {
	t.Helper()
	var e *ExhaustedError
	if !errors.As(err, &e) {
		t.Fatalf("got %v, want a ResourceExhausted refusal", err)
	}
	return e.Reason, e.RetryAfter
}

// TestCallerRate: each identity has its own bucket; over it a caller is
// refused at once with the time until its next token.
func TestCallerRate(t *testing.T) {
	tests := []struct {
		name       string
		caller     Caller
		other      Caller // unaffected by caller's burst
		burst      int    // requests admitted at once
		reason     string
		retryAfter time.Duration
	}{
		{name: "workload identity", caller: workload("shop", "cart"), other: workload("shop", "web"),
			burst: 5, reason: ReasonCallerRate, retryAfter: 100 * time.Millisecond},
		{name: "node proxy Pod", caller: ztunnel("ztunnel-a"), other: ztunnel("ztunnel-b"),
			burst: 20, reason: ReasonNodeProxyRate, retryAfter: 50 * time.Millisecond},
		{name: "another Pod of a workload shares its identity's bucket", caller: func() Caller {
			c := workload("shop", "cart")
			c.Pod = "Kubernetes/shop/cart-2" // ignored: not a node proxy
			return c
		}(), other: workload("shop", "db"), burst: 5, reason: ReasonCallerRate, retryAfter: 100 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &clock{now: time.Unix(1e9, 0)}
			l := newLimiter(Limits{
				Caller:    Budget{Rate: 10, Burst: 5, MaxInFlight: NoLimit},
				NodeProxy: Budget{Rate: 20, Burst: 20, MaxInFlight: NoLimit},
			}, clk.Now)
			for i := range tt.burst {
				if _, err := l.admit(tt.caller); err != nil {
					t.Fatalf("request %d of the burst: %v", i+1, err)
				}
			}
			_, err := l.admit(tt.caller)
			reason, after := limitErr(t, err)
			if reason != tt.reason || after != tt.retryAfter {
				t.Fatalf("refused with %s, retry after %v; want %s, %v", reason, after, tt.reason, tt.retryAfter)
			}
			if !strings.Contains(err.(*ExhaustedError).Msg, "retry in "+tt.retryAfter.String()) {
				t.Errorf("message %q does not say when to retry", err.(*ExhaustedError).Msg)
			}
			if _, err := l.admit(tt.other); err != nil {
				t.Fatalf("another caller: %v", err)
			}
			clk.add(tt.retryAfter / 2)
			if _, err := l.admit(tt.caller); err == nil {
				t.Fatal("admitted before the hint")
			} else if _, after := limitErr(t, err); after != tt.retryAfter/2 {
				t.Fatalf("halfway, retry after %v, want %v", after, tt.retryAfter/2)
			}
			clk.add(tt.retryAfter / 2)
			if _, err := l.admit(tt.caller); err != nil {
				t.Fatalf("at the hint: %v", err)
			}
		})
	}
}

// TestCallerInFlight: a caller's requests in progress are bounded, the
// bound is per key, and a slot given back can be taken again.
func TestCallerInFlight(t *testing.T) {
	tests := []struct {
		name   string
		caller Caller
		other  Caller
		max    int
		reason string
	}{
		{name: "workload identity", caller: workload("shop", "cart"), other: workload("shop", "web"), max: 2, reason: ReasonCallerInFlight},
		{name: "node proxy Pod", caller: ztunnel("ztunnel-a"), other: ztunnel("ztunnel-b"), max: 4, reason: ReasonNodeProxyInFlight},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &clock{now: time.Unix(1e9, 0)}
			l := newLimiter(Limits{Caller: Budget{Rate: NoLimit, MaxInFlight: 2}, NodeProxy: Budget{Rate: NoLimit, MaxInFlight: 4}}, clk.Now)
			var held []func()
			for range tt.max {
				release, err := l.admit(tt.caller)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, release)
			}
			_, err := l.admit(tt.caller)
			if reason, after := limitErr(t, err); reason != tt.reason || after != BusyRetryAfter {
				t.Fatalf("refused with %s after %v, want %s after %v", reason, after, tt.reason, BusyRetryAfter)
			}
			if release, err := l.admit(tt.other); err != nil {
				t.Fatalf("another caller: %v", err)
			} else {
				release()
			}
			held[0]()
			release, err := l.admit(tt.caller)
			if err != nil {
				t.Fatalf("after a slot came back: %v", err)
			}
			release()
			for _, r := range held[1:] {
				r()
			}
			b := l.caller
			if tt.reason == ReasonNodeProxyInFlight {
				b = l.node
			}
			if n := len(b.inFlight); n != 0 {
				t.Fatalf("%d keys kept with nothing in flight", n)
			}
		})
	}
}

// TestNoLimit: negative values turn each budget off.
func TestNoLimit(t *testing.T) {
	l := newLimiter(Limits{Caller: Budget{Rate: NoLimit, MaxInFlight: NoLimit}, PeerFailureRate: NoLimit}, time.Now)
	l.sleep = func(context.Context, time.Duration) error { t.Fatal("a request waited"); return nil }
	for i := range 10_000 {
		if _, err := l.admit(workload("shop", "cart")); err != nil {
			t.Fatal(err)
		}
		settle, err := l.peerTurn(context.Background(), "192.0.2.1:1", fmt.Sprint("forged-", i), false)
		if err != nil {
			t.Fatal(err)
		}
		settle(true)
	}
}

// TestBucketsKeepHeld: a bucket holding a reservation is not idle, however
// full, and outlives new keys sweeping idle ones out.
func TestBucketsKeepHeld(t *testing.T) {
	now := time.Unix(1e9, 0)
	b := newBuckets(1, 1, 100)
	settle, _, ok := b.reserve("holder", now, 0)
	if !ok {
		t.Fatal("a new bucket refused a reservation")
	}
	for i := range 10 {
		b.take(fmt.Sprintf("peer-%d", i), now)
	}
	// Had it been swept, the failure would land in a bucket no longer
	// kept, and the holder would start afresh.
	settle(true, now)
	if wait := b.check("holder", now); wait != time.Second {
		t.Fatalf("the holder's bucket was swept: after its failure, wait %v, want 1s", wait)
	}
}

// TestPeerKey: budgets are kept per exact address, an IPv4 address the
// same however it arrives.
func TestPeerKey(t *testing.T) {
	tests := []struct{ addr, want string }{
		{"192.0.2.7:1234", "192.0.2.7"}, {"[::ffff:192.0.2.7]:1234", "192.0.2.7"}, {"192.0.2.7", "192.0.2.7"},
		{"[2001:db8:1:2:3:4:5:6]:1234", "2001:db8:1:2:3:4:5:6"}, {"[2001:db8:1:2:ffff::1]:99", "2001:db8:1:2:ffff::1"},
		{"[fe80::1%eth0]:1234", "fe80::1%eth0"}, {"not an address", "not an address"}, {"", ""},
	}
	for _, tt := range tests {
		if got := peerKey(tt.addr); got != tt.want {
			t.Errorf("peerKey(%q) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}

// TestBucketsBounded: keys minted by a flood never hold more than max
// buckets, idle (full) buckets go first, and a busy key keeps its debt
// while idle ones are evicted.
func TestBucketsBounded(t *testing.T) {
	clk := &clock{now: time.Unix(1e9, 0)}
	b := newBuckets(1, 2, 100)
	for i := range 10_000 {
		b.take(fmt.Sprintf("peer-%d", i), clk.Now())
	}
	if n := b.len(); n != 100 {
		t.Fatalf("%d buckets after a flood of keys, want the bound 100", n)
	}
	// The flood's buckets are not full yet (one token spent each). Once
	// they have refilled, new keys sweep them out.
	clk.add(2 * time.Second)
	b.take("victim", clk.Now())
	b.take("victim", clk.Now())
	for i := range 50 {
		b.take(fmt.Sprintf("late-%d", i), clk.Now())
	}
	if n := b.len(); n > 52 {
		t.Fatalf("%d buckets: idle ones were not swept", n)
	}
	if wait := b.check("victim", clk.Now()); wait != time.Second {
		t.Fatalf("the victim's bucket was reset (wait %v, want 1s)", wait)
	}
}

// TestAuthnWaitingBounded: past maxWaiting requests waiting for an
// authentication turn, over all peers, more are refused at once.
func TestAuthnWaitingBounded(t *testing.T) {
	l := newPeerLimiter(1, 2)
	hold, err := l.acquire(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { _, _ = l.acquire(ctx, "a") })
	}
	for {
		l.mu.Lock()
		n := l.waiting
		l.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if _, err := l.acquire(context.Background(), "a"); !errors.Is(err, errTooManyWaiting) {
		t.Fatalf("third waiter: %v, want %v", err, errTooManyWaiting)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the refusal took %v", took)
	}
	release, err := l.acquire(context.Background(), "b") // a free peer does not wait
	if err != nil {
		t.Fatal(err)
	}
	release()
	cancel()
	wg.Wait()
	hold()
	if len(l.peers) != 0 || l.waiting != 0 {
		t.Fatalf("%d peers, %d waiting after everyone left", len(l.peers), l.waiting)
	}
}
