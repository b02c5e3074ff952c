package limit

import (
	"context"
	"crypto/sha256"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// peerLimiter bounds the work one peer address may have in progress at a
// stage of the request path. A peer over its budget waits for a turn until
// its context ends; other peers are not held up by it. At most maxWaiting
// requests wait, over all peers: more are refused at once, so the queue
// is bounded whatever the number of connections.
type peerLimiter struct {
	max        int
	maxWaiting int
	mu         sync.Mutex
	peers      map[string]*peerSlots
	waiting    int
}

// peerSlots is one peer's budget; it exists while the peer has work in
// progress or waiting.
type peerSlots struct {
	slots chan struct{}
	users int
}

// errTooManyWaiting: maxWaiting requests already wait for a turn.
var errTooManyWaiting = errors.New("too many requests wait for an authentication turn")

func newPeerLimiter(max, maxWaiting int) *peerLimiter {
	return &peerLimiter{max: max, maxWaiting: maxWaiting, peers: map[string]*peerSlots{}}
}

// acquire takes one of key's slots, waiting until ctx ends. The returned
// func gives the slot back.
func (l *peerLimiter) acquire(ctx context.Context, key string) (func(), error) {
	l.mu.Lock()
	p := l.peers[key]
	if p == nil {
		p = &peerSlots{slots: make(chan struct{}, l.max)}
		l.peers[key] = p
	}
	p.users++
	l.mu.Unlock()
	release := func() { <-p.slots; l.leave(key, p) }
	select {
	case p.slots <- struct{}{}:
		return release, nil
	default:
	}
	if !l.startWaiting() {
		l.leave(key, p)
		return nil, errTooManyWaiting
	}
	defer l.stopWaiting()
	select {
	case p.slots <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		l.leave(key, p)
		return nil, ctx.Err()
	}
}

func (l *peerLimiter) startWaiting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiting >= l.maxWaiting {
		return false
	}
	l.waiting++
	return true
}

func (l *peerLimiter) stopWaiting() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waiting--
}

func (l *peerLimiter) leave(key string, p *peerSlots) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.users--; p.users == 0 {
		delete(l.peers, key)
	}
}

// peerKey is the address a budget is kept for: the peer's exact IP,
// without its port, so that new connections do not buy a new budget, and
// an IPv4 address the same however it arrives (192.0.2.7 or
// ::ffff:192.0.2.7). Addresses are not grouped (an IPv6 /64 is a node's
// Pods): the budgets of an address must not be spent by its neighbours.
func peerKey(addr string) string {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap().String()
	}
	return host
}

// Authenticator is ca.Authenticator as the limits see it: it turns the
// credentials C into a caller R.
type Authenticator[C, R any] interface {
	Authenticate(ctx context.Context, c C) (R, error)
}

// Knower is an authenticator that may hold a token's identity already (a
// cached review): authenticating that token asks no one.
type Knower interface{ Known(token string) bool }

// Verifier is an authenticator that decides by itself, asking no one:
// ca.CertAuthenticator verifies the client certificate in process.
type Verifier interface{ VerifiesInProcess() }

// Authentication is one request's authentication, as its limits see it.
type Authentication[C, R any] struct {
	// Peer is the peer's address, host:port; Token the bearer token, or
	// "". PeerCerts is set when the request presents a client
	// certificate.
	Peer, Token string
	PeerCerts   bool
	// Auths are the authenticators to try, in order.
	Auths []Authenticator[C, R]
	// Costly reports whether an authenticator's error is a refusal that
	// cost something (a review refused the credentials), which spends one
	// of the address's failures; a refusal decided without a review (no
	// credentials, a token that is not a JWT) spends nothing.
	Costly func(error) bool
	// Vouch, when set, is the cluster's word on the token before its
	// review: a token it vouches for that has not failed from this
	// address takes its review turns in the plausible lane (vouch.go).
	// nil: every token is suspect.
	Vouch Vouch
}

// Authenticate has run try a's authenticators under the peer's budgets.
// A request that asks someone to authenticate it (a TokenReview) holds
// one of its address's failures (peerTurn), which it spends if it fails,
// so that an address never has more reviews under way than failures
// left; once they are spent, its reviews take turns as the bucket
// refills. The wait for a turn comes before the wait for one of the
// address's MaxAuthnPerPeer authentication turns, so that requests
// waiting on the address's failures never hold the turns its other
// requests need: one that finds, once it holds an authentication turn,
// that its review turn comes later (the address failed meanwhile) gives
// the authentication turn back while it waits.
//
// An address may be shared (clients behind one NAT, an east-west gateway,
// hostNetwork Pods), and one of them may fail on purpose. So that none of
// them can lock the others out, the failures only ever make the
// address's reviews wait, never refuse a request before it is reviewed;
// a token the cluster vouches for (a.Vouch) that has not failed from the
// address, nor has its subject, waits in a lane of its own, which the
// neighbour's suspect tokens, however many wait, never reach; a request
// that authenticates without asking anyone (a client certificate the
// Verifier accepts, a token whose review is cached) does not wait at
// all; and a refusal that cost nothing (Costly) spends nothing.
func Authenticate[C, R any](ctx context.Context, l *Limiter, a Authentication[C, R],
	try func(context.Context, []Authenticator[C, R]) (R, error)) (caller R, err error) {
	auths := slices.Clone(a.Auths)
	var hold *reviewHold // only for a request that asks someone: not ztunnel's cached token
	// A client certificate may cost nothing: whether the Verifier
	// accepts it is known once the request authenticates.
	free := a.PeerCerts
	for i, au := range auths {
		switch {
		case knows(au, a.Token):
			free = true
		case asksSomeone(au, a.Token):
			if hold == nil {
				hold = l.limits.hold(ctx, a.Peer, a.Token, a.Vouch)
			}
			auths[i] = &budgetedReview[C, R]{Authenticator: au, hold: hold, costly: a.Costly}
		}
	}
	ended := false
	if hold != nil {
		defer func() {
			if !ended {
				hold.end(err)
			}
		}()
		if !free {
			if err := hold.await(ctx); err != nil {
				return caller, err
			}
		}
	}
	for {
		release, err := l.authn.acquire(ctx, peerKey(a.Peer))
		if err != nil {
			return caller, exhausted(ReasonTooManyAuthentications,
				"too many requests from this address are authenticating at once, retry later", BusyRetryAfter, err)
		}
		caller, err = try(ctx, auths)
		if hold == nil || !errors.Is(err, errTurnLater) {
			// The outcome counts before the address's next request
			// takes this authentication turn: a failure makes it wait.
			if hold != nil {
				hold.end(err)
				ended = true
			}
			release()
			return caller, err
		}
		release()
		// The address failed while the request waited for its
		// authentication turn: it waits for its review turn without
		// holding one, then tries again.
		if err := hold.wait(ctx); err != nil {
			return caller, err
		}
	}
}

// knows reports whether a already holds token's identity (a cached
// review): authenticating it asks no one.
func knows(a any, token string) bool {
	k, ok := a.(Knower)
	return ok && token != "" && k.Known(token)
}

// asksSomeone reports whether a, not knowing token already, asks someone
// (a TokenReview) to decide the request: not a Verifier, which decides in
// process, nor a token authenticator given no token.
func asksSomeone(a any, token string) bool {
	switch a.(type) {
	case Verifier:
		return false
	case Knower:
		return token != ""
	}
	return true
}

// reviewHold is a request's share of a review turn of its address
// (limiter.laneTurn), in its token's lane, held from the moment it must
// wait for one, or else first asks someone to authenticate it. end
// spends it if the request failed after a refusal that cost something,
// and gives it back otherwise, and records the outcome of the review
// (limiter.reviewed).
type reviewHold struct {
	limits *limiter
	peer   string // peerKey
	sum    [sha256.Size]byte
	st     standing
	settle func(failed bool) // nil until held
	start  time.Time         // when the held turn comes; zero once waited for
	// failed: a review refused the credentials; passed: one accepted
	// them.
	failed, passed bool
}

// errTurnLater: the request's review turn comes later than now, and it
// holds an authentication turn (reviewHold.take).
var errTurnLater = errors.New("the review turn comes later")

// hold is the reviewHold of token from addr, in the lane v puts it in.
func (l *limiter) hold(ctx context.Context, addr, token string, v Vouch) *reviewHold {
	h := &reviewHold{limits: l, peer: peerKey(addr), sum: sha256.Sum256([]byte(token))}
	h.st = l.classify(ctx, v, h.peer, h.sum, token)
	return h
}

// await takes the request's turn and waits for it, before it takes an
// authentication turn, when its address has no failure free now in its
// lane.
func (h *reviewHold) await(ctx context.Context) error {
	settle, start, err := h.limits.laneTurn(ctx, h.st.lane, h.peer, h.sum, true)
	if err != nil || settle == nil {
		return err
	}
	h.settle, h.start = settle, start
	return h.wait(ctx)
}

// wait waits for the turn held, holding no authentication turn; ended
// early, it gives the turn back.
func (h *reviewHold) wait(ctx context.Context) error {
	if err := h.limits.waitUntil(ctx, h.start); err != nil {
		h.settle(false)
		h.settle = nil
		return err
	}
	h.start = time.Time{}
	return nil
}

// take takes the request's turn as it is about to be reviewed, holding an
// authentication turn, unless it holds one. A turn that comes later is
// errTurnLater, as a limit's refusal (which stops the authenticators):
// Authenticate then gives the authentication turn back while the request
// waits.
func (h *reviewHold) take(ctx context.Context) error {
	if h.settle == nil {
		settle, start, err := h.limits.laneTurn(ctx, h.st.lane, h.peer, h.sum, false)
		if err != nil {
			return err
		}
		h.settle, h.start = settle, start
	}
	if h.start.After(h.limits.now()) {
		return exhausted(ReasonPeerAuthnFailures, "the review turn comes later", 0, errTurnLater)
	}
	return nil
}

func (h *reviewHold) end(err error) {
	failed := err != nil && h.failed
	if h.settle != nil {
		h.settle(failed)
	}
	if failed || (err == nil && h.passed) {
		h.limits.reviewed(h.peer, h.sum, h.st, failed)
	}
}

// budgetedReview is an authenticator that asks someone, run once the
// request holds its turn.
type budgetedReview[C, R any] struct {
	Authenticator[C, R]
	hold   *reviewHold
	costly func(error) bool
}

func (b *budgetedReview[C, R]) Authenticate(ctx context.Context, c C) (R, error) {
	if err := b.hold.take(ctx); err != nil {
		var none R
		return none, err
	}
	caller, err := b.Authenticator.Authenticate(ctx, c)
	switch {
	case err == nil:
		b.hold.passed = true
	case b.costly(err):
		b.hold.failed = true
	}
	return caller, err
}
