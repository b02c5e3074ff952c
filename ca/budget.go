package ca

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
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
	// failed authentications of one peer address (an IPv4 address, an
	// IPv6 /64). A failure spends a token; with none left, the peer's
	// requests are refused before they are authenticated until the bucket
	// refills. A request that authenticates costs nothing, so a node
	// whose ztunnel renews a burst of certificates is never held up by
	// it. A negative rate turns it off.
	PeerFailureRate  float64
	PeerFailureBurst int
	// MaxKeys bounds the buckets kept for each kind of key (identities,
	// node proxy Pods, peer addresses).
	MaxKeys int
}

// Defaults of Limits. A workload identity renews each of its Pods'
// certificates about twice a day; the burst lets a rollout of 500 Pods
// of one service account start at once. A node proxy asks for up to
// ~110 Pods when its node restarts (Kubernetes' default --max-pods; 250
// is the recommended maximum). A peer that fails to authenticate 100
// times in a row is not a misconfigured client that backs off.
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

// busyRetryAfter is the retry hint of a refusal for concurrency (a
// caller's in-flight budget, the issuance slots, a peer's
// authentications): a request takes milliseconds, so a slot is likely
// free by then.
const busyRetryAfter = 250 * time.Millisecond

// Reasons of the ResourceExhausted refusals of the budgets.
const (
	reasonCallerRate             = "caller_rate"
	reasonCallerInFlight         = "caller_in_flight"
	reasonNodeProxyRate          = "node_proxy_rate"
	reasonNodeProxyInFlight      = "node_proxy_in_flight"
	reasonPeerAuthnFailures      = "peer_authn_failures"
	reasonTooManyRequests        = "too_many_requests"
	reasonTooManyAuthentications = "too_many_authentications"
	// reasonNodePodLookups: a node proxy's requests for Pods the index
	// does not hold have used its node's share of apiserver lookups
	// (kube.LookupBudgetError).
	reasonNodePodLookups = "node_pod_lookups"
)

// rateLimitReasons are every reason of meshca_rate_limited_total.
var rateLimitReasons = []string{reasonTooManyRequests, reasonTooManyAuthentications, reasonPeerAuthnFailures,
	reasonCallerRate, reasonCallerInFlight, reasonNodeProxyRate, reasonNodeProxyInFlight, reasonNodePodLookups}

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

// limiter enforces Limits on an injected clock.
type limiter struct {
	now      func() time.Time
	caller   *callerBudget
	node     *callerBudget
	failures *buckets // by peer prefix; nil: off
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
	return &limiter{
		now:      now,
		caller:   budget(l.Caller, reasonCallerRate, reasonCallerInFlight, "this identity"),
		node:     budget(l.NodeProxy, reasonNodeProxyRate, reasonNodeProxyInFlight, "this node proxy"),
		failures: newBuckets(l.PeerFailureRate, l.PeerFailureBurst, l.MaxKeys),
	}
}

// admit takes a turn of c's budget, c having authenticated for cluster:
// one of its in-flight slots, then a token of its bucket. Over either, it
// refuses at once, saying when to retry. release gives the slot back.
func (l *limiter) admit(cluster *Cluster, c *Caller) (release func(), err error) {
	b, key := l.caller, "id "+c.ID.String()
	if cluster.Authorizer != nil && cluster.Authorizer.TrustedNodeAccounts[c.Namespace+"/"+c.ServiceAccount] {
		// Each node proxy Pod serves its own node: every ztunnel of the
		// mesh shares one service account but not one budget.
		b = l.node
		if c.PodName != "" {
			key = "pod " + cluster.ID + "/" + c.Namespace + "/" + c.PodName
		}
	}
	return l.take(b, key, b.who)
}

// admitNode takes a turn of the node proxy budget for the kubelet of
// node, which asks for its Pods' certificates through
// PodCertificateRequests as a ztunnel does through CreateCertificate.
func (l *limiter) admitNode(node string) (release func(), err error) {
	return l.take(l.node, "node "+node, "this node")
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
			fmt.Sprintf("%s already has %d requests in progress, the most it may, retry in %v", who, b.b.MaxInFlight, busyRetryAfter),
			busyRetryAfter, fmt.Errorf("%s: %d in flight", key, b.b.MaxInFlight))
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

// peerAllowed refuses a peer that has spent its authentication failures,
// before its request waits for an authentication turn. The failures held
// by authentications in progress (peerReserve) count as spent.
func (l *limiter) peerAllowed(addr string) error {
	if l.failures == nil {
		return nil
	}
	p := peerPrefix(addr)
	if wait := l.failures.check(p, l.now()); wait > 0 {
		return peerFailuresSpent(p, wait)
	}
	return nil
}

// peerReserve holds one of the peer's authentication failures for an
// authentication about to cost a review, or refuses as peerAllowed does:
// so the reviews an address has in progress never outnumber the failures
// it has left, however many of its requests ran peerAllowed at once.
// settle ends the hold: a failure spends it, anything else gives it back.
func (l *limiter) peerReserve(addr string) (settle func(failed bool), err error) {
	if l.failures == nil {
		return func(bool) {}, nil
	}
	p := peerPrefix(addr)
	done, wait, ok := l.failures.reserve(p, l.now())
	if !ok {
		return nil, peerFailuresSpent(p, wait)
	}
	return func(failed bool) { done(failed, l.now()) }, nil
}

// peerFailuresSpent is the refusal of a peer with no failures left.
func peerFailuresSpent(prefix string, wait time.Duration) *Error {
	return exhausted(reasonPeerAuthnFailures,
		fmt.Sprintf("too many failed authentications from this address, retry in %v", wait),
		wait, fmt.Errorf("peer %s: bucket of authentication failures empty", prefix))
}

// exhausted is a ResourceExhausted refusal that says when to retry.
func exhausted(reason, msg string, retry time.Duration, err error) *Error {
	return &Error{Code: codes.ResourceExhausted, Reason: reason, Msg: msg, RetryAfter: retry, Err: err}
}

// peerPrefix is the address a peer's failures are counted for: its IPv4
// address, or the /64 of its IPv6 address (one host usually holds a whole
// /64, so counting single IPv6 addresses would count nothing).
func peerPrefix(addr string) string {
	host := peerKey(addr)
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is4() {
		return ip.String()
	}
	p, _ := ip.Prefix(64)
	return p.String()
}
