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

// The tokens of these tests say what they are: "good-<subject>-..." is
// valid, anything else is refused by its review; a token whose subject
// part is "none" is one the cluster does not vouch for.

// vouchFake vouches for "<kind>-<subject>-..." tokens whose subject is
// not "none", as a cluster does for tokens naming a live Pod.
type vouchFake struct{}

func (vouchFake) Plausible(_ context.Context, token string) (string, bool) {
	parts := strings.SplitN(token, "-", 3)
	if len(parts) < 2 || parts[1] == "none" {
		return "", false
	}
	return "pod " + parts[1], true
}

var errRefused = errors.New("review refused the token")

// reviewFake is a TokenReview: it asks someone, accepts good tokens and
// counts every review.
type reviewFake struct{ n atomic.Int64 }

func (r *reviewFake) Authenticate(_ context.Context, token string) (string, error) {
	r.n.Add(1)
	if strings.HasPrefix(token, "good-") {
		return token, nil
	}
	return "", errRefused
}

// lanes is a Limiter with the default failure budget on an injected
// clock, a reviewer and a Vouch; sleep is its Sleep.
type lanes struct {
	clk     *clock
	l       *Limiter
	reviews *reviewFake
	vouch   Vouch
}

func newLanes(t *testing.T, sleep func(context.Context, time.Duration) error) *lanes {
	t.Helper()
	return newLanesWith(t, Config{MaxInFlight: 1024, MaxAuthnPerPeer: 64, Sleep: sleep})
}

// newLanesWith is newLanes with c's limits; its clock is set.
func newLanesWith(t *testing.T, c Config) *lanes {
	t.Helper()
	clk := &clock{now: time.Unix(1e9, 0)}
	if c.Sleep == nil {
		c.Sleep = sleeper(clk)
	}
	c.Now = clk.Now
	return &lanes{clk: clk, reviews: &reviewFake{}, vouch: vouchFake{}, l: New(c)}
}

// authn authenticates token from addr with life to live, as ca does.
func (ls *lanes) authn(addr, token string, life time.Duration) error {
	return ls.authnWith(ls.reviews, addr, token, life)
}

// authnWith is authn with the reviewer r.
func (ls *lanes) authnWith(r Authenticator[string, string], addr, token string, life time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), life)
	defer cancel()
	_, err := Authenticate(ctx, ls.l, Authentication[string, string]{
		Peer: addr, Token: token, Auths: []Authenticator[string, string]{r},
		Costly: func(err error) bool { return errors.Is(err, errRefused) }, Vouch: ls.vouch,
	}, func(ctx context.Context, auths []Authenticator[string, string]) (string, error) {
		return auths[0].Authenticate(ctx, token)
	})
	return err
}

// spendBurst has the default burst of failures spent from addr by
// tokens the cluster does not vouch for.
func (ls *lanes) spendBurst(t *testing.T, addr string) {
	t.Helper()
	for i := range DefaultPeerFailureBurst {
		if err := ls.authn(addr, fmt.Sprint("forged-none-burst-", i), time.Minute); !errors.Is(err, errRefused) {
			t.Fatalf("forged token %d of the burst: %v", i+1, err)
		}
	}
}

// TestPlausibleTokenServedDuringFlood (issue 28, item 3): a neighbour
// keeps about 300 requests with tokens the cluster does not vouch for
// waiting for the address's review turns (10 a second, 30 s to live),
// so that the address's turns for the next 30 s are taken. A fresh
// token the cluster vouches for, from the same address, is reviewed at
// once, without waiting; a fresh random token is still queued behind the
// flood: refused at once, its turn being past its deadline.
func TestPlausibleTokenServedDuringFlood(t *testing.T) {
	const flooder, neighbour = "192.0.2.7:40000", "192.0.2.7:50000"
	release := make(chan struct{})
	var waiting atomic.Int64
	var ls *lanes
	ls = newLanes(t, func(ctx context.Context, d time.Duration) error {
		waiting.Add(1)
		defer waiting.Add(-1)
		select {
		case <-release:
			ls.clk.add(d)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	ls.spendBurst(t, flooder)
	var wg sync.WaitGroup
	var refused atomic.Int64
	for i := range 320 {
		wg.Go(func() {
			switch err := ls.authn(flooder, fmt.Sprint("random-none-", i), 30*time.Second); {
			case reasonOf(err) == ReasonPeerAuthnFailures:
				refused.Add(1)
			case !errors.Is(err, errRefused):
				t.Errorf("flood request %d: %v", i, err)
			}
		})
	}
	defer func() {
		close(release)
		wg.Wait()
	}()
	for deadline := time.Now().Add(10 * time.Second); waiting.Load()+refused.Load() < 320; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d flood requests wait for their turns, %d refused, of 320", waiting.Load(), refused.Load())
		}
	}
	if n := waiting.Load(); n < 290 {
		t.Fatalf("%d flood requests wait for their turns, want about 300", n)
	}
	before := ls.reviews.n.Load()
	start := time.Now()
	if err := ls.authn(neighbour, "good-web-fresh", 30*time.Second); err != nil {
		t.Fatalf("a fresh token the cluster vouches for, during the flood: %v", err)
	}
	if took := time.Since(start); took > time.Second || ls.clk.Now() != time.Unix(1e9, 0) {
		t.Fatalf("the fresh plausible token took %v and waited %v for a turn, want none", took, ls.clk.Now().Sub(time.Unix(1e9, 0)))
	}
	if n := ls.reviews.n.Load() - before; n != 1 {
		t.Fatalf("%d reviews for the fresh token", n)
	}
	err := ls.authn(neighbour, "random-none-fresh", 30*time.Second)
	if reason, after := limitErr(t, err); reason != ReasonPeerAuthnFailures || after < 29*time.Second {
		t.Fatalf("a fresh random token during the flood: %s, turn in %v; want %s, behind the flood's 30 s of turns",
			reason, after, ReasonPeerAuthnFailures)
	}
}

// TestPlausibleLaneMarks (issue 28, item 3): a plausible token that
// fails its review marks itself and its subject as failed at its
// address: it, and any other token claiming that subject, wait their
// turns with the suspect ones from then on (so a forger gets one review
// per live Pod it can name), while other subjects and other addresses
// keep theirs; once a token of the subject passes, the subject is
// plausible there again.
func TestPlausibleLaneMarks(t *testing.T) {
	const peer = "192.0.2.7:40000"
	ls := newLanes(t, nil)
	ls.spendBurst(t, peer)
	// A short deadline: a request put in the suspect lane, whose next
	// turn is 100 ms away, is refused at once; one in the plausible lane
	// is reviewed.
	const short = 200 * time.Millisecond
	steps := []struct {
		name, addr, token string
		want              string // "served", "refused" (its review), or a limit's reason
	}{
		{"a forged token naming a live Pod is reviewed at once", peer, "forged-web-1", "refused"},
		{"the same token again waits with the suspect ones", peer, "forged-web-1", ReasonPeerAuthnFailures},
		{"another token naming that Pod waits", peer, "forged-web-2", ReasonPeerAuthnFailures},
		{"even a good one: its subject failed from here", peer, "good-web-3", ReasonPeerAuthnFailures},
		{"another Pod's good token is reviewed at once", peer, "good-db-1", "served"},
		{"a token the cluster does not vouch for waits", peer, "good-none-1", ReasonPeerAuthnFailures},
		{"another address keeps the subject", "192.0.2.8:1", "forged-web-4", "refused"},
	}
	run := func(addr, token string, life time.Duration) string {
		switch err := ls.authn(addr, token, life); {
		case err == nil:
			return "served"
		case errors.Is(err, errRefused):
			return "refused"
		default:
			return reasonOf(err)
		}
	}
	for _, st := range steps {
		if got := run(st.addr, st.token, short); got != st.want {
			t.Fatalf("%s (%s from %s): %q, want %q", st.name, st.token, st.addr, got, st.want)
		}
	}
	// With time to wait its turn, web's good token is served; web is
	// then plausible here again.
	if got := run(peer, "good-web-3", time.Minute); got != "served" {
		t.Fatalf("web's good token with a minute to live: %q", got)
	}
	if got := run(peer, "good-web-5", short); got != "served" {
		t.Fatalf("web's next token, once one passed: %q, want served at once", got)
	}
}

// TestFailureLanesBounded (issue 28, item 3): however its tokens are
// made, an address costs the apiserver a bounded number of reviews.
// Fresh random tokens, one after another, each wait their turn in the
// suspect lane: the burst, then the failure rate. Forged tokens naming
// live Pods, a new one each time, are reviewed at once until the
// plausible lane's own bucket (the same size) is spent, then wait their
// turns there.
func TestFailureLanesBounded(t *testing.T) {
	const flood, burst, rate = 2000, DefaultPeerFailureBurst, float64(DefaultPeerFailureRate)
	const peer = "192.0.2.7:40000"
	for _, tt := range []struct{ name, subject string }{{"random tokens", "none"}, {"a live Pod each", ""}} {
		t.Run(tt.name, func(t *testing.T) {
			ls := newLanes(t, nil)
			start := ls.clk.Now()
			for i := range flood {
				subject := tt.subject
				if subject == "" {
					subject = fmt.Sprint("pod", i)
				}
				if err := ls.authn(peer, fmt.Sprintf("forged-%s-%d", subject, i), time.Minute); !errors.Is(err, errRefused) {
					t.Fatalf("forged token %d: %v", i+1, err)
				}
			}
			elapsed := ls.clk.Now().Sub(start)
			if most := burst + int(rate*elapsed.Seconds()); flood > most {
				t.Fatalf("%d reviews in %v, want at most %d", flood, elapsed, most)
			}
			if elapsed < time.Duration(float64(flood-burst)/rate*float64(time.Second))-time.Second {
				t.Fatalf("%d reviews in %v: they did not wait their turns", flood, elapsed)
			}
		})
	}
}

// gatedReview is reviewFake whose reviews wait for gate to open.
type gatedReview struct {
	*reviewFake
	gate chan struct{}
}

func (g gatedReview) Authenticate(ctx context.Context, token string) (string, error) {
	<-g.gate
	return g.reviewFake.Authenticate(ctx, token)
}

// TestTurnWaitedWithoutAuthnTurn (issue 28, item 3): a request that came
// while its address had failures to spare, and finds at its review, once
// it holds one of the address's authentication turns
// (MaxAuthnPerPeer), that the address has failed meanwhile and its
// review turn comes later, gives the authentication turn back while it
// waits: a plausible token from the address is not kept out of the
// authentication turns by requests waiting for the suspect lane.
func TestTurnWaitedWithoutAuthnTurn(t *testing.T) {
	const peer = "192.0.2.7:40000"
	release := make(chan struct{})
	var waiting atomic.Int64
	ls := newLanesWith(t, Config{MaxInFlight: 16, MaxAuthnPerPeer: 1, Limits: Limits{PeerFailureRate: 1, PeerFailureBurst: 1},
		Sleep: func(ctx context.Context, d time.Duration) error {
			waiting.Add(1)
			defer waiting.Add(-1)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}})
	gated := gatedReview{reviewFake: ls.reviews, gate: make(chan struct{})}
	var wg sync.WaitGroup
	defer func() {
		close(release)
		wg.Wait()
	}()
	// The first spends the address's one failure, while the second waits
	// for the one authentication turn; both came with a failure to spare.
	until := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal(what + ": not within 10s")
			}
		}
	}
	authnWaiting := func() int {
		ls.l.authn.mu.Lock()
		defer ls.l.authn.mu.Unlock()
		return ls.l.authn.waiting
	}
	wg.Go(func() { _ = ls.authnWith(gated, peer, "forged-none-1", time.Minute) })
	until("the first request holds the authentication turn", func() bool {
		ls.l.authn.mu.Lock()
		defer ls.l.authn.mu.Unlock()
		p := ls.l.authn.peers[peerKey(peer)]
		return p != nil && len(p.slots) == 1
	})
	wg.Go(func() { _ = ls.authnWith(ls.reviews, peer, "forged-none-2", time.Minute) })
	until("the second request waits for the authentication turn", func() bool { return authnWaiting() == 1 })
	gated.gate <- struct{}{} // the first fails; the second's review turn is 1 s away
	until("the second request waits for its review turn", func() bool { return waiting.Load() == 1 })
	if err := ls.authn(peer, "good-web-1", 2*time.Second); err != nil {
		t.Fatalf("a plausible token while a suspect one waits for its review turn: %v", err)
	}
}

// TestFailedMarksBounded: the marks of failed tokens and subjects are
// kept up to the bound, over all addresses, the least recently failed
// going first.
func TestFailedMarksBounded(t *testing.T) {
	m := newFailedMarks(100)
	first := markOf("192.0.2.1", markSubject, []byte("victim"))
	m.add(first)
	for i := range 10_000 {
		m.add(markOf(fmt.Sprint("192.0.2.", i%250), markToken, []byte(fmt.Sprint(i))))
		if i == 50 {
			m.add(first) // failed again: kept
		}
	}
	if n := m.len(); n != 100 {
		t.Fatalf("%d marks, want the bound 100", n)
	}
	if m.has(first) {
		t.Fatal("the least recently failed mark was kept")
	}
}
