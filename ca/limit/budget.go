package limit

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"
)

// NoLimit, in a field of Limits or ConnLimits, turns that limit off.
const NoLimit = -1

// Budget is what one caller may ask of the CA. A caller over it is
// refused at once with ResourceExhausted and told when to retry; nothing
// waits in a queue for a caller's budget.
type Budget struct {
	// Rate is how many requests a second the caller's token bucket
	// refills with, Burst how many tokens it holds: a caller may send
	// Burst requests at once, then Rate a second. A negative Rate turns
	// the rate limit off.
	Rate  float64
	Burst int
	// MaxInFlight bounds the caller's requests served at once; negative
	// turns it off.
	MaxInFlight int
}

// Limits are the budgets kept per caller and per peer. Zero fields take
// the defaults below.
type Limits struct {
	// Caller is the budget of each workload identity (SPIFFE ID), shared
	// by every Pod of its service account.
	Caller Budget
	// NodeProxy is the budget of each node proxy Pod (a caller whose
	// service account is a trusted node account): one ztunnel asks for
	// the identities of every Pod on its node.
	NodeProxy Budget
	// PeerFailureRate and PeerFailureBurst are the token bucket of the
	// failed authentications of one peer address (its exact IP). A
	// review that fails spends a token; one that succeeds costs nothing,
	// so a node whose ztunnel renews a burst of certificates is never held
	// up by it. With no token left, the address's reviews take turns:
	// each waits, before it takes an authentication turn
	// (Config.MaxAuthnPerPeer), until the bucket has refilled a token
	// for it, and only a request whose turn would come too late for its
	// deadline is refused. Those turns are for suspect tokens: a token
	// the cluster vouches for (Vouch: a bound token naming a live Pod)
	// that has not failed from the address, nor has its Pod, takes its
	// turns in a lane of its own, from a second bucket of this size that
	// only such tokens' failures spend (each a failure of the address
	// too): a neighbour flooding the address with suspect tokens never
	// delays it. One that needs no review (a client certificate, a
	// cached token) does not wait at all; requests that carry the same
	// token share one turn, as they share one review
	// (kube.CachedTokenReviewer). A negative rate turns it off.
	PeerFailureRate  float64
	PeerFailureBurst int
	// MaxKeys bounds the buckets kept for each kind of key (identities,
	// node proxy Pods, peer addresses), and the failed tokens and Pods
	// remembered over all addresses.
	MaxKeys int
}

// Defaults of Limits. A workload identity renews each of its Pods'
// certificates about twice a day; the burst lets a rollout of 500 Pods
// of one service account start at once. A node proxy asks for up to
// ~110 Pods when its node restarts (Kubernetes' default --max-pods; 250
// is the recommended maximum). A peer that fails to authenticate 100
// times in a row is not a misconfigured client that backs off; after
// that its suspect tokens' reviews cost the apiserver 10 a second at
// most, and a good token from its address that the cluster does not
// vouch for waits for a turn, 100 ms once the failures stop.
var (
	DefaultCallerBudget    = Budget{Rate: 50, Burst: 500, MaxInFlight: 32}
	DefaultNodeProxyBudget = Budget{Rate: 200, Burst: 1000, MaxInFlight: 256}
)

const (
	DefaultPeerFailureRate  = 10
	DefaultPeerFailureBurst = 100
	// DefaultLimitKeys is how many buckets of each kind are kept: ~200
	// bytes each.
	DefaultLimitKeys = 16384
)

// BusyRetryAfter is the retry hint of a refusal for concurrency (a
// caller's in-flight budget, the issuance slots, a peer's
// authentications): a request takes milliseconds, so a slot is likely
// free by then.
const BusyRetryAfter = 250 * time.Millisecond

// Reasons of the ResourceExhausted refusals of the budgets.
const (
	ReasonCallerRate             = "caller_rate"
	ReasonCallerInFlight         = "caller_in_flight"
	ReasonNodeProxyRate          = "node_proxy_rate"
	ReasonNodeProxyInFlight      = "node_proxy_in_flight"
	ReasonTooManyRequests        = "too_many_requests"
	ReasonTooManyAuthentications = "too_many_authentications"
	// ReasonPeerAuthnFailures: the address has spent its failures and
	// the request's review turn would come too late for its deadline.
	ReasonPeerAuthnFailures = "peer_authn_failures"
	// ReasonNodePodLookups: a node proxy's requests for Pods the index
	// does not hold have used its node's share of apiserver lookups
	// (kube.LookupBudgetError).
	ReasonNodePodLookups = "node_pod_lookups"
)

// Reasons are every reason of meshca_rate_limited_total.
var Reasons = []string{ReasonTooManyRequests, ReasonTooManyAuthentications, ReasonPeerAuthnFailures,
	ReasonCallerRate, ReasonCallerInFlight, ReasonNodeProxyRate, ReasonNodeProxyInFlight, ReasonNodePodLookups}

func (b Budget) withDefaults(d Budget) Budget {
	if b.Rate == 0 {
		b.Rate = d.Rate
	}
	if b.Burst <= 0 {
		b.Burst = d.Burst
	}
	if b.MaxInFlight == 0 {
		b.MaxInFlight = d.MaxInFlight
	}
	return b
}

func (l Limits) withDefaults() Limits {
	l.Caller = l.Caller.withDefaults(DefaultCallerBudget)
	l.NodeProxy = l.NodeProxy.withDefaults(DefaultNodeProxyBudget)
	if l.PeerFailureRate == 0 {
		l.PeerFailureRate = DefaultPeerFailureRate
	}
	if l.PeerFailureBurst <= 0 {
		l.PeerFailureBurst = DefaultPeerFailureBurst
	}
	if l.MaxKeys <= 0 {
		l.MaxKeys = DefaultLimitKeys
	}
	return l
}

// limiter enforces Limits on an injected clock; sleep waits on it.
type limiter struct {
	now      func() time.Time
	sleep    func(ctx context.Context, d time.Duration) error
	caller   *callerBudget
	node     *callerBudget
	failures *buckets // by peer address; nil: off
	// plausible are the failures of the plausible lane (vouch.go), by
	// peer address; nil when failures is.
	plausible *buckets
	marks     *failedMarks // nil when failures is

	mu    sync.Mutex
	turns map[string]*turn // by lane, peer address and token hash, while in use
}

// callerBudget is one kind of caller's budget: a bucket and an in-flight
// count per key.
type callerBudget struct {
	b              Budget
	rates          *buckets // nil: no rate limit
	rateReason     string
	inFlightReason string
	who            string // "this identity", for the client's message

	mu       sync.Mutex
	inFlight map[string]int // a key exists while it has requests in flight
}

func newLimiter(l Limits, now func() time.Time) *limiter {
	l = l.withDefaults()
	budget := func(b Budget, rateReason, inFlightReason, who string) *callerBudget {
		return &callerBudget{b: b, rates: newBuckets(b.Rate, b.Burst, l.MaxKeys), rateReason: rateReason,
			inFlightReason: inFlightReason, who: who, inFlight: map[string]int{}}
	}
	lim := &limiter{
		now:      now,
		sleep:    timerSleep,
		turns:    map[string]*turn{},
		caller:   budget(l.Caller, ReasonCallerRate, ReasonCallerInFlight, "this identity"),
		node:     budget(l.NodeProxy, ReasonNodeProxyRate, ReasonNodeProxyInFlight, "this node proxy"),
		failures: newBuckets(l.PeerFailureRate, l.PeerFailureBurst, l.MaxKeys),
	}
	if lim.failures != nil {
		lim.plausible = newBuckets(l.PeerFailureRate, l.PeerFailureBurst, l.MaxKeys)
		lim.marks = newFailedMarks(l.MaxKeys)
	}
	return lim
}

// Caller is an authenticated caller as its budget sees it.
type Caller struct {
	// ID is the caller's identity (its SPIFFE ID).
	ID string
	// NodeProxy is set when the caller's service account is a trusted
	// node account of its cluster.
	NodeProxy bool
	// Pod names a node proxy's Pod, cluster/namespace/name, or "".
	Pod string
}

// admit takes a turn of c's budget: one of its in-flight slots, then a
// token of its bucket. Over either, it refuses at once, saying when to
// retry. release gives the slot back.
func (l *limiter) admit(c Caller) (release func(), err error) {
	b, key := l.caller, "id "+c.ID
	if c.NodeProxy {
		// Each node proxy Pod serves its own node: every ztunnel of the
		// mesh shares one service account but not one budget.
		b = l.node
		if c.Pod != "" {
			key = "pod " + c.Pod
		}
	}
	return l.take(b, key, b.who)
}

// take takes one of key's in-flight slots of b, then a token of its
// bucket; who names the caller in the refusal.
func (l *limiter) take(b *callerBudget, key, who string) (release func(), err error) {
	release, err = b.enter(key, who)
	if err != nil {
		return nil, err
	}
	if b.rates == nil {
		return release, nil
	}
	if wait, ok := b.rates.take(key, l.now()); !ok {
		release()
		return nil, exhausted(b.rateReason,
			fmt.Sprintf("%s is over its request rate (%g a second, bursts of %d), retry in %v", who, b.b.Rate, b.b.Burst, wait),
			wait, fmt.Errorf("%s: bucket empty", key))
	}
	return release, nil
}

// enter takes one of key's in-flight slots.
func (b *callerBudget) enter(key, who string) (func(), error) {
	if b.b.MaxInFlight < 0 {
		return func() {}, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inFlight[key] >= b.b.MaxInFlight {
		return nil, exhausted(b.inFlightReason,
			fmt.Sprintf("%s already has %d requests in progress, the most it may, retry in %v", who, b.b.MaxInFlight, BusyRetryAfter),
			BusyRetryAfter, fmt.Errorf("%s: %d in flight", key, b.b.MaxInFlight))
	}
	b.inFlight[key]++
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.inFlight[key]--; b.inFlight[key] <= 0 {
			delete(b.inFlight, key)
		}
	}, nil
}

// turn is a review of one token from one address, shared by the requests
// that carry it: it holds one failure of its lane's bucket for the
// address from the moment it is taken until its last request has settled.
type turn struct {
	start  time.Time // when its reviews may start, on the limiter's clock
	users  int
	failed bool
	settle func(spend bool, now time.Time)
}

// peerTurn is laneTurn in the suspect lane, for token from addr, waiting
// for the turn.
func (l *limiter) peerTurn(ctx context.Context, addr, token string, lazy bool) (settle func(failed bool), err error) {
	settle, start, err := l.laneTurn(ctx, suspectLane, peerKey(addr), sha256.Sum256([]byte(token)), lazy)
	if err != nil || settle == nil {
		return settle, err
	}
	if err := l.waitUntil(ctx, start); err != nil {
		settle(false)
		return nil, err
	}
	return settle, nil
}

// laneTurn holds, for a review of the token whose hash is sum for the
// peer address peer, one of the address's failures in lane ln, which a
// failure spends (settle(true)) and anything else gives back. With none
// free the request's turn comes at start, once the bucket has refilled
// one for it after the turns before it in its lane (its holder waits
// until then: waitUntil), and it is refused at once when that would leave
// it less than reviewTime before ctx's deadline. Requests with the same
// token share a turn. When lazy, a request whose address has a failure
// free now holds nothing: settle is nil, and it takes its turn when it
// comes to be reviewed (so that requests do not hold failures, uncounted
// while the bucket is full, before their authentication turns bound how
// many review at once).
//
// The suspect lane's bucket is the address's failures
// (Limits.PeerFailureRate); the plausible lane's is its own, of the same
// size, and a failure there spends one of the address's failures too, so
// that the address's failures count every failure from it.
func (l *limiter) laneTurn(ctx context.Context, ln lane, peer string, sum [sha256.Size]byte, lazy bool) (settle func(failed bool), start time.Time, err error) {
	b := l.failures
	if ln == plausibleLane {
		b = l.plausible
	}
	if b == nil {
		return func(bool) {}, time.Time{}, nil
	}
	key := string(ln) + peer + "\x00" + string(sum[:])
	// A turn must leave the review time to run before the deadline.
	most := untilDeadline(ctx) - reviewTime
	now := l.now()
	l.mu.Lock()
	t := l.turns[key]
	switch {
	case t == nil && lazy && b.check(peer, now) == 0:
		l.mu.Unlock()
		return nil, time.Time{}, nil
	case t == nil:
		settle, wait, ok := b.reserve(peer, now, most)
		if !ok {
			l.mu.Unlock()
			return nil, time.Time{}, peerFailuresSpent(ln, peer, wait, most+reviewTime)
		}
		if ln == plausibleLane {
			settle = l.countFailure(peer, settle)
		}
		t = &turn{start: now.Add(wait), settle: settle}
		l.turns[key] = t
	case t.start.Sub(now) > 0 && t.start.Sub(now) > most:
		l.mu.Unlock()
		return nil, time.Time{}, peerFailuresSpent(ln, peer, t.start.Sub(now), most+reviewTime)
	}
	t.users++
	l.mu.Unlock()
	return func(failed bool) { l.leave(key, t, failed) }, t.start, nil
}

// waitUntil waits until start on the limiter's clock, or until ctx ends.
func (l *limiter) waitUntil(ctx context.Context, start time.Time) error {
	if wait := start.Sub(l.now()); wait > 0 {
		return l.sleep(ctx, wait)
	}
	return nil
}

// countFailure is settle that also spends one of peer's failures when it
// spends.
func (l *limiter) countFailure(peer string, settle func(spend bool, now time.Time)) func(spend bool, now time.Time) {
	return func(spend bool, now time.Time) {
		settle(spend, now)
		if spend {
			l.failures.spend(peer, now)
		}
	}
}

// leave ends one request's share of t; the last one settles it.
func (l *limiter) leave(key string, t *turn, failed bool) {
	l.mu.Lock()
	t.users--
	t.failed = t.failed || failed
	last := t.users == 0
	if last && l.turns[key] == t {
		delete(l.turns, key)
	}
	l.mu.Unlock()
	if last {
		t.settle(t.failed, l.now())
	}
}

// reviewTime is the time a review turn must leave before the request's
// deadline: a TokenReview takes milliseconds, more when the apiserver is
// busy, and a review the request cannot wait for is a review wasted.
const reviewTime = 250 * time.Millisecond

// untilDeadline is the time ctx has left; a day when it has no deadline.
func untilDeadline(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d)
	}
	return 24 * time.Hour
}

// timerSleep waits d, or until ctx ends.
func timerSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// peerFailuresSpent is the refusal of a request whose address has spent
// its failures and whose turn would come in wait, too late for its
// deadline, in left.
func peerFailuresSpent(ln lane, peer string, wait, left time.Duration) *ExhaustedError {
	return exhausted(ReasonPeerAuthnFailures,
		fmt.Sprintf("too many failed authentications from this address: its tokens are reviewed in turn, and this request's turn comes too late for its deadline, retry in %v", wait),
		wait, fmt.Errorf("peer %s: bucket of authentication failures of %s tokens empty; the next review turn is in %v, the request's deadline in %v",
			peer, ln, wait, left.Round(time.Millisecond)))
}
