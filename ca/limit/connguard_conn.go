package limit

import (
	"container/list"
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// The states of a guarded connection.
const (
	connHandshake       int32 = iota // TLS handshake and HTTP/2 preface under way
	connUnauthenticated              // serving; no request authenticated yet
	connAuthed                       // a request authenticated: only grpc-go's limits apply
	connClosed
)

// maxRefusedStreamsPerConn closes a connection once this many of its
// streams have been refused by a cap, or, before it authenticates,
// cancelled to make room (streamEvicted): a client that keeps opening
// streams past a cap without backing off is not one to keep. It also
// bounds what the refused streams leave behind until the connection
// closes (grpc-go does not cancel the context of a stream its tap
// refuses: see TagConn).
const maxRefusedStreamsPerConn = 32

// guardedConn is an admitted connection. Its one timer is the handshake
// deadline, then the limits of an unauthenticated connection.
type guardedConn struct {
	net.Conn
	g        *ConnGuard
	peer     netip.Addr
	addrs    connAddrs
	accepted time.Time

	// unauthed is its element in its address's connections not yet
	// authenticated, nil once it is not one; under g.mu.
	unauthed *list.Element

	tmu   sync.Mutex
	timer *time.Timer // nil until armed

	// cancel ends the context of the connection that grpc-go derives
	// every stream's from; set by TagConn.
	cancel context.CancelFunc

	state          atomic.Int32
	active         atomic.Int32 // RPCs in progress
	lastActive     atomic.Int64 // unix nanoseconds: serving began, or an RPC ended
	refusedStreams atomic.Int32
}

// Close closes the connection and, the first time, releases its place.
func (c *guardedConn) Close() error {
	if c.state.Swap(connClosed) != connClosed {
		c.stop()
		c.g.release(c)
	}
	return c.Conn.Close()
}

// arm runs check in d; not at all when d is negative.
func (c *guardedConn) arm(d time.Duration) {
	if d < 0 {
		return
	}
	c.tmu.Lock()
	defer c.tmu.Unlock()
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.check)
		return
	}
	c.timer.Reset(d)
}

func (c *guardedConn) stop() {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
}

// deadline is how long until limit d, counted from since, runs out: at
// most 0, or -1 when d is off.
func deadline(d time.Duration, since time.Time, now time.Time) time.Duration {
	if d <= 0 {
		return -1
	}
	return max(d-now.Sub(since), 0)
}

// sooner is the sooner of two deadlines, -1 being none.
func sooner(a, b time.Duration) time.Duration {
	switch {
	case a < 0:
		return b
	case b < 0:
		return a
	}
	return min(a, b)
}

// handshakeDeadline is when check must look at a connection still
// handshaking.
func (c *guardedConn) handshakeDeadline() time.Duration {
	now := time.Now()
	return sooner(deadline(c.g.lim.TLSHandshakeTimeout, c.accepted, now), deadline(c.g.lim.MaxUnauthenticatedAge, c.accepted, now))
}

// check runs when the timer fires.
func (c *guardedConn) check() {
	switch c.state.Load() {
	case connHandshake:
		now := time.Now()
		switch {
		case deadline(c.g.lim.TLSHandshakeTimeout, c.accepted, now) == 0:
			c.expire(connHandshake, refusedHandshake)
		case deadline(c.g.lim.MaxUnauthenticatedAge, c.accepted, now) == 0:
			c.expire(connHandshake, refusedUnauthAge)
		default:
			c.arm(c.handshakeDeadline())
		}
	case connUnauthenticated:
		if reason, next := c.unauthenticatedDue(time.Now()); reason != "" {
			c.expire(connUnauthenticated, reason)
		} else {
			c.arm(next)
		}
	}
}

// unauthenticatedDue is why an unauthenticated connection is to close
// now, or "" and how long until check must look again (-1: never).
func (c *guardedConn) unauthenticatedDue(now time.Time) (string, time.Duration) {
	age := deadline(c.g.lim.MaxUnauthenticatedAge, c.accepted, now)
	if age == 0 {
		return refusedUnauthAge, 0
	}
	idleLimit := c.g.lim.MaxUnauthenticatedIdle
	idle := deadline(idleLimit, time.Unix(0, c.lastActive.Load()), now)
	if idleLimit > 0 && c.active.Load() > 0 {
		idle = idleLimit // busy: look again in a full idle period
	}
	if idle == 0 {
		return refusedUnauthIdle, 0
	}
	return "", sooner(age, idle)
}

// expire closes the connection for reason if it is still in state from.
func (c *guardedConn) expire(from int32, reason string) {
	if !c.state.CompareAndSwap(from, connClosed) {
		return
	}
	c.stop()
	c.g.release(c)
	c.g.strike(c.peer)
	c.g.refuse(c.g.refused, "connection closed", reason, c.peer)
	c.Conn.Close()
}

// closeFor closes the connection for reason, whatever its state.
func (c *guardedConn) closeFor(reason string) {
	if c.state.Swap(connClosed) == connClosed {
		return
	}
	c.stop()
	c.g.release(c)
	c.g.strike(c.peer)
	c.g.refuse(c.g.refused, "connection closed", reason, c.peer)
	c.Conn.Close()
}

// closeEvicted closes a connection makeRoomLocked took out of the
// counts, for reason.
func (c *guardedConn) closeEvicted(reason string) {
	c.stop()
	c.g.refuse(c.g.refused, "connection closed", reason, c.peer)
	reset(c.Conn)
}

// serving is called once grpc-go serves the connection: its handshake is
// done, and the limits of an unauthenticated connection start.
func (c *guardedConn) serving() {
	now := time.Now()
	c.lastActive.Store(now.UnixNano())
	if !c.state.CompareAndSwap(connHandshake, connUnauthenticated) {
		return
	}
	if _, next := c.unauthenticatedDue(now); next >= 0 {
		c.arm(next)
	} else {
		c.stop()
	}
}

// authenticated records that a request on c authenticated.
func (c *guardedConn) authenticated() {
	if !c.state.CompareAndSwap(connUnauthenticated, connAuthed) {
		return
	}
	c.stop()
	c.g.mu.Lock()
	c.g.authedLocked(c)
	c.g.trustLocked(c.peer, time.Now())
	c.g.mu.Unlock()
}

// streamEvicted counts a stream of c cancelled to make room for another
// connection's: as a refused one while c has not authenticated, not at
// all once it has. The newcomer's own connection did it, and an
// evicted stream leaves nothing behind; an authenticated connection is
// never closed for its neighbours' streams.
func (c *guardedConn) streamEvicted() {
	if c.state.Load() != connAuthed {
		c.streamRefused()
	}
}

// streamRefused counts a refused stream of c, and closes c at
// maxRefusedStreamsPerConn.
func (c *guardedConn) streamRefused() {
	if c.refusedStreams.Add(1) == maxRefusedStreamsPerConn {
		// Not here: grpc-go calls the tap with its transport's lock held.
		go c.closeFor(refusedStreamsRefused)
	}
}
