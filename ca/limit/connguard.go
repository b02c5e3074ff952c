package limit

import (
	"container/list"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ConnGuard admits the gRPC server's connections and streams under
// ConnLimits' caps and deadlines, so that a peer without credentials
// holds a bounded share of the server whatever it sends.
//
// Its Listener closes a connection past MaxConnectionsPerPeer as soon as
// it is accepted, before its TLS handshake and before grpc-go spends a
// goroutine on it. Past MaxConnections it makes room by closing the
// oldest connection not yet authenticated (handshaking, or serving with
// no request authenticated) of the address holding the most connections,
// unless the newcomer's own address holds as many: only then, or when no
// connection may be closed, is the newcomer refused. Connections not yet
// authenticated have a smaller budget of their own: past
// MaxUnauthenticatedConnectionsPerPeer a newcomer is refused at accept;
// past MaxUnauthenticatedConnections the oldest such connection of the
// address holding the most is closed in its place if that address holds
// at least two more than the newcomer's, else the newcomer is refused.
// The connections it
// admits are closed when their TLS handshake and HTTP/2 preface take
// longer than TLSHandshakeTimeout, and, until one of their requests
// authenticates, when they have had no RPC in progress for
// MaxUnauthenticatedIdle or are MaxUnauthenticatedAge old.
//
// As the gRPC server's stats handler it learns which connection an RPC
// runs on; as its tap (AdmitStream) it bounds the streams whose request
// has not authenticated and cancels those whose request message is late
// (connguard_streams.go); the server tells it when a request
// authenticates (ConnAuthenticated).
//
// Every refusal and closing is counted in
// meshca_connections_refused_total{reason} or
// meshca_streams_refused_total{reason} and logged at debug level, at
// most once a second; meshca_connections_open is the connections it
// holds, meshca_connections_unauthenticated those of them not yet
// authenticated, meshca_streams_unauthenticated the streams it counts.
type ConnGuard struct {
	lim            ConnLimits
	log            *slog.Logger
	refused        *prometheus.CounterVec
	open           prometheus.Gauge
	unauthOpen     prometheus.Gauge
	streamsRefused *prometheus.CounterVec
	unauthStreams  prometheus.Gauge

	mu     sync.Mutex
	total  int
	byPeer map[netip.Addr]*connPeer
	byAddr map[connAddrs]*guardedConn
	// unauthed is the connections not yet authenticated, of all
	// addresses.
	unauthed int
	// heavy weighs each address that has a connection not yet
	// authenticated by its number of connections, heavyUnauthed by its
	// number of connections not yet authenticated.
	heavy         *heaviest[netip.Addr]
	heavyUnauthed *heaviest[netip.Addr]
	streams       streamCounts
	// cool is the addresses cooled down or on their way to it
	// (connguard_cooldown.go).
	cool coolings

	lastLog    atomic.Int64 // unix nanoseconds of the last refusal logged
	suppressed atomic.Int64 // refusals not logged since
}

// connPeer is what one address holds.
type connPeer struct {
	n int // connections open
	// unauthed are its connections not yet authenticated, oldest first:
	// the ones a full server may close.
	unauthed list.List
}

// ConnGuardConfig is what NewConnGuard takes.
type ConnGuardConfig struct {
	// Limits: MaxConnections(PerPeer),
	// MaxUnauthenticatedConnections(PerPeer), TLSHandshakeTimeout,
	// MaxUnauthenticatedIdle, MaxUnauthenticatedAge,
	// RequestMessageTimeout, MaxUnauthenticatedStreams(PerPeer),
	// MaxHealthWatches(PerPeer) and KeepaliveTimeout are used; zero
	// fields take ConnLimits' defaults.
	Limits     ConnLimits
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// The reason label values of meshca_connections_refused_total.
const (
	refusedTotal          = "total"
	refusedPerPeer        = "per_peer"
	refusedEvicted        = "evicted"
	refusedUnauthTotal    = "unauthenticated_total"
	refusedUnauthPerPeer  = "unauthenticated_per_peer"
	refusedUnauthEvicted  = "evicted_unauthenticated"
	refusedHandshake      = "handshake_timeout"
	refusedUnauthIdle     = "unauthenticated_idle"
	refusedUnauthAge      = "unauthenticated_age"
	refusedStreamsRefused = "streams_refused"
	refusedCooling        = "cooling_down"
	refusalLogInterval    = time.Second
)

// NewConnGuard returns a guard registering its metrics with c.Registerer.
func NewConnGuard(c ConnGuardConfig) *ConnGuard {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	g := &ConnGuard{
		lim: c.Limits.WithDefaults(0),
		log: c.Logger,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshca_connections_refused_total",
			Help: "gRPC connections closed by meshca's connection guard: at accept, past --max-connections-per-peer (per_peer) or --max-connections with nothing to close in their place (total); " +
				"closed to make room for a connection from an address holding fewer (evicted); " +
				"past --max-unauthenticated-connections-per-peer (unauthenticated_per_peer) or --max-unauthenticated-connections with no address holding two more to close one of (unauthenticated_total), at accept; " +
				"not yet authenticated, closed to make room for a connection from an address holding at least two fewer past --max-unauthenticated-connections (evicted_unauthenticated); " +
				"later, past --tls-handshake-timeout (handshake_timeout), --max-connection-idle-unauthenticated (unauthenticated_idle) or --max-connection-age-unauthenticated (unauthenticated_age), " +
				"or after 32 of their streams were refused (streams_refused); " +
				"at accept, from an address cooled down for the unauthenticated connections of it meshca kept closing, up to --max-unauthenticated-cooldown (cooling_down).",
		}, []string{"reason"}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshca_connections_open", Help: "gRPC connections open (accepted and not yet closed).",
		}),
		unauthOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshca_connections_unauthenticated", Help: "gRPC connections open on which no request has authenticated yet (handshaking included).",
		}),
		byPeer:        map[netip.Addr]*connPeer{},
		byAddr:        map[connAddrs]*guardedConn{},
		heavy:         newHeaviest[netip.Addr](),
		heavyUnauthed: newHeaviest[netip.Addr](),
	}
	g.streams.init()
	g.cool.init(g.lim.MaxUnauthenticatedCooldown)
	g.streamsRefused, g.unauthStreams = newStreamMetrics()
	for _, r := range []string{refusedTotal, refusedPerPeer, refusedEvicted, refusedUnauthTotal, refusedUnauthPerPeer, refusedUnauthEvicted,
		refusedHandshake, refusedUnauthIdle, refusedUnauthAge, refusedStreamsRefused, refusedCooling} {
		g.refused.WithLabelValues(r)
	}
	if c.Registerer != nil {
		c.Registerer.MustRegister(g.refused, g.open, g.unauthOpen, g.streamsRefused, g.unauthStreams)
	}
	return g
}

// Listener returns l guarded: its Accept returns only the connections g
// admits, and closes the others.
func (g *ConnGuard) Listener(l net.Listener) net.Listener { return &guardListener{Listener: l, g: g} }

type guardListener struct {
	net.Listener
	g *ConnGuard
}

func (l *guardListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.g.admit(c); gc != nil {
			return gc, nil
		}
	}
}

// connAddrs names a connection: its two ends.
type connAddrs struct{ local, remote netip.AddrPort }

func addrPort(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		ap := t.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// admit returns c guarded, or closes it and returns nil when a cap is
// reached and no connection can be closed in its place.
func (g *ConnGuard) admit(c net.Conn) *guardedConn {
	addrs := connAddrs{local: addrPort(c.LocalAddr()), remote: addrPort(c.RemoteAddr())}
	peer := addrs.remote.Addr()
	g.mu.Lock()
	p := g.byPeer[peer]
	if p == nil {
		p = &connPeer{}
	}
	var evicted *guardedConn
	why := refusedCooling
	if !g.coolingLocked(peer, time.Now()) {
		evicted, why = g.makeRoomLocked(peer, p)
	}
	if evicted == nil && why != "" {
		if p.n == 0 {
			delete(g.byPeer, peer)
		}
		g.mu.Unlock()
		g.refuse(g.refused, "connection refused", why, peer)
		reset(c)
		return nil
	}
	g.byPeer[peer] = p
	gc := &guardedConn{Conn: c, g: g, peer: peer, addrs: addrs, accepted: time.Now()}
	g.total++
	p.n++
	gc.unauthed = p.unauthed.PushBack(gc)
	g.unauthed++
	g.weighLocked(peer, p)
	g.byAddr[addrs] = gc
	g.mu.Unlock()
	g.open.Inc()
	g.unauthOpen.Inc()
	if evicted != nil {
		evicted.closeEvicted(why)
	}
	setUserTimeout(c, g.lim.KeepaliveTimeout)
	gc.arm(gc.handshakeDeadline())
	return gc
}

// makeRoomLocked finds room for a connection from peer, which holds p:
// it returns "" when there is room; or a connection not yet
// authenticated that it took out of the counts for closeEvicted, and
// why; or nil and why the newcomer is refused. One connection taken out
// frees a place under every cap.
func (g *ConnGuard) makeRoomLocked(peer netip.Addr, p *connPeer) (*guardedConn, string) {
	lim := g.lim
	for {
		var from netip.Addr
		why := ""
		switch {
		case lim.MaxConnectionsPerPeer > 0 && p.n >= lim.MaxConnectionsPerPeer:
			return nil, refusedPerPeer
		case lim.MaxUnauthenticatedConnectionsPerPeer > 0 && p.unauthed.Len() >= lim.MaxUnauthenticatedConnectionsPerPeer:
			return nil, refusedUnauthPerPeer
		case lim.MaxConnections > 0 && g.total >= lim.MaxConnections:
			top, n, ok := g.heavy.top()
			if !ok || n <= p.n {
				return nil, refusedTotal
			}
			from, why = top, refusedEvicted
		case lim.MaxUnauthenticatedConnections > 0 && g.unauthed >= lim.MaxUnauthenticatedConnections:
			// Only for an address holding at least two fewer: addresses
			// within one of each other do not take each other's places,
			// which would turn a flood's every dial into a TLS handshake.
			top, n, ok := g.heavyUnauthed.top()
			if !ok || n < p.unauthed.Len()+2 {
				return nil, refusedUnauthTotal
			}
			from, why = top, refusedUnauthEvicted
		default:
			return nil, ""
		}
		c := g.byPeer[from].unauthed.Front().Value.(*guardedConn)
		// A connection authenticating or closing meanwhile leaves the
		// list once it has the lock: take it out now and look again.
		if !c.state.CompareAndSwap(connHandshake, connClosed) && !c.state.CompareAndSwap(connUnauthenticated, connClosed) {
			g.authedLocked(c)
			continue
		}
		g.releaseLocked(c)
		return c, why
	}
}

// reset closes c with a reset, not a FIN: no TIME_WAIT left here per
// refusal.
func reset(c net.Conn) {
	if t, ok := c.(*net.TCPConn); ok {
		_ = t.SetLinger(0)
	}
	c.Close()
}

// release forgets c, once it is closed.
func (g *ConnGuard) release(c *guardedConn) {
	g.mu.Lock()
	g.releaseLocked(c)
	g.mu.Unlock()
}

func (g *ConnGuard) releaseLocked(c *guardedConn) {
	g.total--
	p := g.byPeer[c.peer]
	p.n--
	g.dropUnauthedLocked(c, p)
	if p.n == 0 {
		delete(g.byPeer, c.peer)
	}
	g.weighLocked(c.peer, p)
	delete(g.byAddr, c.addrs)
	g.open.Dec()
}

// authedLocked takes c out of its address's connections not yet
// authenticated, those that a full server may close.
func (g *ConnGuard) authedLocked(c *guardedConn) {
	p := g.byPeer[c.peer]
	if g.dropUnauthedLocked(c, p) {
		g.weighLocked(c.peer, p)
	}
}

// dropUnauthedLocked takes c, of p, out of the connections not yet
// authenticated; false if it was not one.
func (g *ConnGuard) dropUnauthedLocked(c *guardedConn, p *connPeer) bool {
	if c.unauthed == nil {
		return false
	}
	p.unauthed.Remove(c.unauthed)
	c.unauthed = nil
	g.unauthed--
	g.unauthOpen.Dec()
	return true
}

// weighLocked updates the weights of peer, which holds p, in heavy and
// heavyUnauthed.
func (g *ConnGuard) weighLocked(peer netip.Addr, p *connPeer) {
	n := p.unauthed.Len()
	g.heavyUnauthed.set(peer, n)
	if n == 0 {
		g.heavy.set(peer, 0)
		return
	}
	g.heavy.set(peer, p.n)
}

// refuse counts a refusal in counter and logs it as msg, unless one was
// logged less than refusalLogInterval ago: a flood of refusals is one
// line a second.
func (g *ConnGuard) refuse(counter *prometheus.CounterVec, msg, reason string, peer netip.Addr) {
	counter.WithLabelValues(reason).Inc()
	now, last := time.Now().UnixNano(), g.lastLog.Load()
	if now-last < int64(refusalLogInterval) || !g.lastLog.CompareAndSwap(last, now) {
		g.suppressed.Add(1)
		return
	}
	g.mu.Lock()
	open, streams := g.total, g.streams.total
	g.mu.Unlock()
	g.log.Debug(msg, logReason, reason, logPeer, peer.String(), logOpenConns, open, logSuppressed, g.suppressed.Swap(0), logUnauthStreams, streams)
}
