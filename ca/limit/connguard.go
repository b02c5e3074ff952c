package limit

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"
)

// ConnGuard admits the gRPC server's connections under ConnLimits'
// connection caps and deadlines. Its Listener closes a connection past
// MaxConnections or MaxConnectionsPerPeer as soon as it is accepted,
// before its TLS handshake and before grpc-go spends a goroutine on it;
// the connections it admits are closed when their TLS handshake and
// HTTP/2 preface take longer than TLSHandshakeTimeout, or, until one of
// their requests authenticates, when they have had no RPC in progress for
// MaxUnauthenticatedIdle. As the gRPC server's stats.Handler (ServerOption)
// it learns which connection an RPC runs on; the server tells it when a
// request authenticates.
//
// Every refusal and closing is counted in
// meshca_connections_refused_total{reason} and logged at debug level, at
// most once a second; meshca_connections_open is the connections it holds.
type ConnGuard struct {
	lim     ConnLimits
	log     *slog.Logger
	refused *prometheus.CounterVec
	open    prometheus.Gauge

	mu     sync.Mutex
	total  int
	byPeer map[netip.Addr]int
	byAddr map[connAddrs]*guardedConn

	lastLog    atomic.Int64 // unix nanoseconds of the last refusal logged
	suppressed atomic.Int64 // refusals not logged since
}

// ConnGuardConfig is what NewConnGuard takes.
type ConnGuardConfig struct {
	// Limits: MaxConnections, MaxConnectionsPerPeer, TLSHandshakeTimeout,
	// MaxUnauthenticatedIdle and KeepaliveTimeout are used; zero fields
	// take ConnLimits' defaults.
	Limits     ConnLimits
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// The reason label values of meshca_connections_refused_total.
const (
	refusedTotal       = "total"
	refusedPerPeer     = "per_peer"
	refusedHandshake   = "handshake_timeout"
	refusedUnauthIdle  = "unauthenticated_idle"
	refusalLogInterval = time.Second
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
			Help: "gRPC connections closed by meshca's connection guard: at accept, past --max-connections (total) or --max-connections-per-peer (per_peer); " +
				"later, past --tls-handshake-timeout (handshake_timeout) or --max-connection-idle-unauthenticated (unauthenticated_idle).",
		}, []string{"reason"}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshca_connections_open", Help: "gRPC connections open (accepted and not yet closed).",
		}),
		byPeer: map[netip.Addr]int{},
		byAddr: map[connAddrs]*guardedConn{},
	}
	for _, r := range []string{refusedTotal, refusedPerPeer, refusedHandshake, refusedUnauthIdle} {
		g.refused.WithLabelValues(r)
	}
	if c.Registerer != nil {
		c.Registerer.MustRegister(g.refused, g.open)
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
// reached.
func (g *ConnGuard) admit(c net.Conn) *guardedConn {
	addrs := connAddrs{local: addrPort(c.LocalAddr()), remote: addrPort(c.RemoteAddr())}
	peer := addrs.remote.Addr()
	g.mu.Lock()
	reason := ""
	switch {
	case g.lim.MaxConnections > 0 && g.total >= g.lim.MaxConnections:
		reason = refusedTotal
	case g.lim.MaxConnectionsPerPeer > 0 && g.byPeer[peer] >= g.lim.MaxConnectionsPerPeer:
		reason = refusedPerPeer
	}
	if reason != "" {
		g.mu.Unlock()
		g.refuse(reason, peer)
		if t, ok := c.(*net.TCPConn); ok {
			// A reset, not a FIN: no TIME_WAIT left here per refusal.
			_ = t.SetLinger(0)
		}
		c.Close()
		return nil
	}
	gc := &guardedConn{Conn: c, g: g, peer: peer, addrs: addrs}
	g.total++
	g.byPeer[peer]++
	g.byAddr[addrs] = gc
	g.mu.Unlock()
	g.open.Inc()
	setUserTimeout(c, g.lim.KeepaliveTimeout)
	if d := g.lim.TLSHandshakeTimeout; d > 0 {
		gc.arm(d)
	}
	return gc
}

// release forgets c, once it is closed.
func (g *ConnGuard) release(c *guardedConn) {
	g.mu.Lock()
	g.total--
	if n := g.byPeer[c.peer] - 1; n > 0 {
		g.byPeer[c.peer] = n
	} else {
		delete(g.byPeer, c.peer)
	}
	delete(g.byAddr, c.addrs)
	g.mu.Unlock()
	g.open.Dec()
}

// refuse counts a refusal and logs it, unless one was logged less than
// refusalLogInterval ago: a flood of connections is one line a second.
func (g *ConnGuard) refuse(reason string, peer netip.Addr) {
	g.refused.WithLabelValues(reason).Inc()
	now, last := time.Now().UnixNano(), g.lastLog.Load()
	if now-last < int64(refusalLogInterval) || !g.lastLog.CompareAndSwap(last, now) {
		g.suppressed.Add(1)
		return
	}
	g.mu.Lock()
	open := g.total
	g.mu.Unlock()
	g.log.Debug("connection refused", logReason, reason, logPeer, peer.String(), logOpenConns, open, logSuppressed, g.suppressed.Swap(0))
}

// The states of a guarded connection.
const (
	connHandshake       int32 = iota // TLS handshake and HTTP/2 preface under way
	connUnauthenticated              // serving; no request authenticated yet
	connAuthed                       // a request authenticated: only grpc-go's limits apply
	connClosed
)

// guardedConn is an admitted connection. Its one timer is the handshake
// deadline, then the unauthenticated idle limit.
type guardedConn struct {
	net.Conn
	g     *ConnGuard
	peer  netip.Addr
	addrs connAddrs

	tmu   sync.Mutex
	timer *time.Timer // nil until armed

	state      atomic.Int32
	active     atomic.Int32 // RPCs in progress
	lastActive atomic.Int64 // unix nanoseconds: serving began, or an RPC ended
}

// Close closes the connection and, the first time, releases its place.
func (c *guardedConn) Close() error {
	if c.state.Swap(connClosed) != connClosed {
		c.stop()
		c.g.release(c)
	}
	return c.Conn.Close()
}

// arm runs check in d.
func (c *guardedConn) arm(d time.Duration) {
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

// check runs when the timer fires.
func (c *guardedConn) check() {
	switch c.state.Load() {
	case connHandshake:
		c.expire(connHandshake, refusedHandshake)
	case connUnauthenticated:
		idle := c.g.lim.MaxUnauthenticatedIdle
		if c.active.Load() > 0 {
			c.arm(idle)
			return
		}
		if since := time.Since(time.Unix(0, c.lastActive.Load())); since < idle {
			c.arm(idle - since)
			return
		}
		c.expire(connUnauthenticated, refusedUnauthIdle)
	}
}

// expire closes the connection for reason if it is still in state from.
func (c *guardedConn) expire(from int32, reason string) {
	if !c.state.CompareAndSwap(from, connClosed) {
		return
	}
	c.stop()
	c.g.release(c)
	c.g.refuse(reason, c.peer)
	c.Conn.Close()
}

// serving is called once grpc-go serves the connection: its handshake is
// done, and the unauthenticated idle limit starts.
func (c *guardedConn) serving() {
	c.lastActive.Store(time.Now().UnixNano())
	if !c.state.CompareAndSwap(connHandshake, connUnauthenticated) {
		return
	}
	if idle := c.g.lim.MaxUnauthenticatedIdle; idle > 0 {
		c.arm(idle)
	} else {
		c.stop()
	}
}

// connKey is the context key of an RPC's *guardedConn.
type connKey struct{}

// ConnAuthenticated records that a request on ctx's connection
// authenticated: the connection is no longer closed for being idle
// unauthenticated. Without a guarded connection it does nothing.
func ConnAuthenticated(ctx context.Context) {
	c, ok := ctx.Value(connKey{}).(*guardedConn)
	if ok && c.state.CompareAndSwap(connUnauthenticated, connAuthed) {
		c.stop()
	}
}

// TagConn finds the guarded connection grpc-go now serves and puts it in
// the connection's context, which every RPC's context derives from.
func (g *ConnGuard) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	g.mu.Lock()
	c := g.byAddr[connAddrs{local: addrPort(info.LocalAddr), remote: addrPort(info.RemoteAddr)}]
	g.mu.Unlock()
	if c == nil {
		return ctx
	}
	c.serving()
	return context.WithValue(ctx, connKey{}, c)
}

// HandleConn implements stats.Handler.
func (g *ConnGuard) HandleConn(context.Context, stats.ConnStats) {}

// TagRPC implements stats.Handler.
func (g *ConnGuard) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC counts the RPCs in progress on a connection, so that one
// waiting for an answer is not idle.
func (g *ConnGuard) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.Begin:
		if c, ok := ctx.Value(connKey{}).(*guardedConn); ok {
			c.active.Add(1)
		}
	case *stats.End:
		if c, ok := ctx.Value(connKey{}).(*guardedConn); ok {
			c.lastActive.Store(time.Now().UnixNano())
			c.active.Add(-1)
		}
	}
}
