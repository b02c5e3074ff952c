package limit

import (
	"net/netip"
	"time"
)

// An address whose unauthenticated connections the guard keeps closing
// (handshakes that never finish, connections idle or old without a
// request authenticated, connections whose streams keep being refused)
// is cooled down: its new connections are refused at accept, before
// their TLS handshake and before grpc-go spends a goroutine on them, for
// a time that doubles while the closings go on, up to
// MaxUnauthenticatedCooldown. A flood that re-dials whatever is closed
// then costs the server an accept and a reset a dial instead of a
// handshake, HTTP/2 state and streams to refuse.
//
// An address that a request authenticated from in the last
// cooldownTrust, or that holds an authenticated connection, is never
// cooled: clients behind one address (a node's SNAT, an east-west
// gateway) that do authenticate keep the per-address caps alone, and an
// authentication ends any cool-down of its address. A client that
// never authenticated from a cooled address is refused as one past the
// address's cap already is, and re-dials.
const (
	// cooldownStrikes is how many of its unauthenticated connections the
	// guard closes before their address cools down, each time.
	cooldownStrikes = 8
	// cooldownFirst is the first cool-down; each next one, while the
	// closings go on, is twice as long, up to MaxUnauthenticatedCooldown.
	cooldownFirst = time.Second
	// cooldownTrust is how long an authentication from an address keeps
	// it from being cooled.
	cooldownTrust = 10 * time.Minute
	// maxCoolingAddrs bounds the addresses remembered: past it, an
	// address not yet remembered is not cooled (the caps still hold).
	maxCoolingAddrs = 1 << 16
)

// cooling is what the guard remembers of one address.
type cooling struct {
	strikes int       // closings since the last cool-down began
	level   uint      // cool-downs in a row
	until   time.Time // its connections are refused until then
	last    time.Time // its last closing
	trusted time.Time // a request from it authenticated then
}

// coolings is the addresses remembered, under ConnGuard.mu.
type coolings struct {
	max    time.Duration // MaxUnauthenticatedCooldown; <= 0: off
	m      map[netip.Addr]*cooling
	pruned time.Time
}

func (cs *coolings) init(max time.Duration) {
	cs.max = max
	cs.m = map[netip.Addr]*cooling{}
}

// forget is how long after its last closing an address's cool-downs
// start over from cooldownFirst.
func (cs *coolings) forget() time.Duration { return 2 * cs.max }

// coolingLocked reports whether peer's new connections are refused now.
func (g *ConnGuard) coolingLocked(peer netip.Addr, now time.Time) bool {
	c := g.cool.m[peer]
	return c != nil && now.Before(c.until)
}

// strike counts a closing of one of peer's unauthenticated connections,
// and cools peer down at every cooldownStrikes-th.
func (g *ConnGuard) strike(peer netip.Addr) {
	cs := &g.cool
	if cs.max <= 0 {
		return
	}
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if p := g.byPeer[peer]; p != nil && p.n > p.unauthed.Len() {
		return // it holds an authenticated connection
	}
	c := cs.entryLocked(peer, now)
	if c == nil {
		return
	}
	if !c.trusted.IsZero() && now.Sub(c.trusted) < cooldownTrust {
		return
	}
	if now.Sub(c.last) > cs.forget() {
		c.strikes, c.level = 0, 0
	}
	c.last = now
	if c.strikes++; c.strikes < cooldownStrikes {
		return
	}
	d := min(cooldownFirst<<min(c.level, 30), cs.max)
	c.strikes, c.until = 0, now.Add(d)
	if d < cs.max {
		c.level++
	}
}

// trustLocked records that a request from peer authenticated: it ends
// peer's cool-down and keeps it from the next for cooldownTrust.
func (g *ConnGuard) trustLocked(peer netip.Addr, now time.Time) {
	cs := &g.cool
	if cs.max <= 0 {
		return
	}
	c := cs.entryLocked(peer, now)
	if c == nil {
		return
	}
	*c = cooling{trusted: now}
}

// entryLocked is what is remembered of peer, a new entry if nothing
// was and there is room for it, else nil.
func (cs *coolings) entryLocked(peer netip.Addr, now time.Time) *cooling {
	c := cs.m[peer]
	if c == nil && cs.roomLocked(now) {
		c = &cooling{}
		cs.m[peer] = c
	}
	return c
}

// roomLocked reports whether one more address can be remembered. It
// forgets those with nothing left to remember once a minute, or once a
// second when no more can be.
func (cs *coolings) roomLocked(now time.Time) bool {
	full := len(cs.m) >= maxCoolingAddrs
	if since := now.Sub(cs.pruned); since < time.Second || !full && since < time.Minute {
		return !full
	}
	cs.pruned = now
	for a, c := range cs.m {
		if now.After(c.until) && now.Sub(c.last) > cs.forget() && now.Sub(c.trusted) > cooldownTrust {
			delete(cs.m, a)
		}
	}
	return len(cs.m) < maxCoolingAddrs
}
