package ca

import (
	"context"
	"errors"
	"net"
	"sync"
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

// peerKey is the address a budget is kept for: the peer's IP, without its
// port, so that new connections do not buy a new budget.
func peerKey(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}
