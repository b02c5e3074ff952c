package limit

import (
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HTTPConns caps the connections of an HTTP server (HTTPLimits'
// MaxConnections and MaxConnectionsPerPeer), in front of its listener.
// A new connection past its address's cap takes the place of that
// address's oldest idle one (kept alive between requests), and is closed
// (reset) as soon as it is accepted when the address has none idle,
// before net/http spends a goroutine on it. At the total cap a new
// connection takes the place of a connection of the address holding the
// most (its oldest idle one, else its oldest) when that address holds at
// least two more than the new connection's does, else of the oldest idle
// connection of any address; with none idle it is closed. So a client
// that opens a connection per request and never closes it does not lock
// itself or others out (an idle connection costs its client a reconnect
// at most), and clients that fill the server from a few addresses cannot
// keep out a kubelet probe or a scrape from another: to fill it with
// connections that are not idle they need as many addresses as
// connections.
//
// Every refusal and eviction is counted in
// meshca_http_connections_refused_total{server,reason} and logged at
// debug level, at most once a second; meshca_http_connections_open{server}
// is the connections held.
type HTTPConns struct {
	server        string
	max, perPeer  int
	open          prometheus.Gauge
	refused       func(reason string) prometheus.Counter
	log           *slog.Logger
	mu            sync.Mutex
	total         int
	seq           uint64                     // of the last connection admitted
	byPeer        map[netip.Addr][]*httpConn // each address's, oldest first
	lastLog, supp atomic.Int64
}

// HTTPConnsConfig is what NewHTTPConns takes.
type HTTPConnsConfig struct {
	// Server names the server in the metrics' server label and the log:
	// "admin", "bundle_endpoint".
	Server string
	// Limits: MaxConnections and MaxConnectionsPerPeer are used; zero
	// fields take HTTPLimits' defaults.
	Limits HTTPLimits
	// Metrics counts the refusals; nil counts nothing.
	Metrics *HTTPConnMetrics
	Logger  *slog.Logger
}

// The reason label values of meshca_http_connections_refused_total.
const (
	httpRefusedTotal   = "total"
	httpRefusedPerPeer = "per_peer"
	httpEvicted        = "evicted"
)

// HTTPConnMetrics are the metrics of every HTTPConns of one registry.
type HTTPConnMetrics struct {
	open    *prometheus.GaugeVec
	refused *prometheus.CounterVec
}

// NewHTTPConnMetrics registers the metrics of HTTPConns with reg.
func NewHTTPConnMetrics(reg prometheus.Registerer) *HTTPConnMetrics {
	m := &HTTPConnMetrics{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshca_http_connections_open",
			Help: "Connections open on an HTTP server without authentication (admin: --admin-listen; bundle_endpoint: --bundle-endpoint-listen).",
		}, []string{"server"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshca_http_connections_refused_total",
			Help: "Connections of an HTTP server closed by its connection caps: at accept, past --admin-max-connections-per-peer with none of the address's idle (per_peer) or, " +
				"every address holding one, past --admin-max-connections (total); or closed to make room for a new one, of its address or of another (evicted).",
		}, []string{"server", "reason"}),
	}
	reg.MustRegister(m.open, m.refused)
	return m
}

// NewHTTPConns returns the caps of c.Server's connections.
func NewHTTPConns(c HTTPConnsConfig) *HTTPConns {
	lim := c.Limits.WithDefaults()
	h := &HTTPConns{server: c.Server, max: lim.MaxConnections, perPeer: lim.MaxConnectionsPerPeer, log: c.Logger,
		byPeer: map[netip.Addr][]*httpConn{}}
	if h.log == nil {
		h.log = slog.Default()
	}
	if m := c.Metrics; m != nil {
		h.open = m.open.WithLabelValues(c.Server)
		h.refused = func(reason string) prometheus.Counter { return m.refused.WithLabelValues(c.Server, reason) }
		for _, r := range []string{httpRefusedTotal, httpRefusedPerPeer, httpEvicted} {
			h.refused(r)
		}
	}
	return h
}

// Attach caps srv's connections: it returns l, whose Accept returns only
// the connections h admits and closes the others, for srv to serve, and
// has srv tell h which of them are idle.
func (h *HTTPConns) Attach(srv *http.Server, l net.Listener) net.Listener {
	srv.ConnState = h.connState
	return &httpConnsListener{Listener: l, h: h}
}

type httpConnsListener struct {
	net.Listener
	h *HTTPConns
}

func (l *httpConnsListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if hc := l.h.admit(c); hc != nil {
			return hc, nil
		}
	}
}

// admit returns c counted, or closes it and returns nil when a cap is
// reached; at the total cap it may close another connection in its stead.
func (h *HTTPConns) admit(c net.Conn) net.Conn {
	peer := addrPort(c.RemoteAddr()).Addr()
	h.mu.Lock()
	var evicted *httpConn
	reason := ""
	switch {
	case h.perPeer > 0 && len(h.byPeer[peer]) >= h.perPeer:
		if evicted = oldestIdle(h.byPeer[peer]); evicted == nil {
			reason = httpRefusedPerPeer
		}
	case h.max > 0 && h.total >= h.max:
		if evicted = h.roomFor(peer); evicted == nil {
			reason = httpRefusedTotal
		}
	}
	if reason != "" {
		h.mu.Unlock()
		h.refuse(reason, peer)
		reset(c)
		return nil
	}
	if evicted != nil {
		h.forget(evicted)
	}
	h.seq++
	hc := &httpConn{Conn: c, h: h, peer: peer, seq: h.seq}
	h.byPeer[peer] = append(h.byPeer[peer], hc)
	h.total++
	h.mu.Unlock()
	if evicted != nil {
		h.refuse(httpEvicted, evicted.peer)
		reset(evicted.Conn)
	} else if h.open != nil {
		h.open.Inc()
	}
	return hc
}

// roomFor returns the connection to close for a new one from peer at the
// total cap: one of the address holding the most, its oldest idle one
// else its oldest, when it holds at least two more than peer; else the
// oldest idle one of any address; nil when none. Called with h.mu held.
func (h *HTTPConns) roomFor(peer netip.Addr) *httpConn {
	var most []*httpConn
	for _, conns := range h.byPeer {
		if len(conns) > len(most) {
			most = conns
		}
	}
	if len(most) >= len(h.byPeer[peer])+2 {
		if c := oldestIdle(most); c != nil {
			return c
		}
		return most[0]
	}
	var idle *httpConn
	for _, conns := range h.byPeer {
		if c := oldestIdle(conns); c != nil && (idle == nil || c.seq < idle.seq) {
			idle = c
		}
	}
	return idle
}

// oldestIdle is the first of conns kept alive between requests, or nil.
// Called with h.mu held.
func oldestIdle(conns []*httpConn) *httpConn {
	for _, c := range conns {
		if c.idle {
			return c
		}
	}
	return nil
}

// connState follows net/http's view of a connection: idle while it is
// kept alive between requests.
func (h *HTTPConns) connState(c net.Conn, s http.ConnState) {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	hc, ok := c.(*httpConn)
	if !ok {
		return
	}
	h.mu.Lock()
	hc.idle = s == http.StateIdle
	h.mu.Unlock()
}

// forget drops c from the counts, once. Called with h.mu held.
func (h *HTTPConns) forget(c *httpConn) {
	if c.gone {
		return
	}
	c.gone = true
	h.total--
	conns := h.byPeer[c.peer]
	if i := slices.Index(conns, c); i >= 0 {
		conns = slices.Delete(conns, i, i+1)
	}
	if len(conns) == 0 {
		delete(h.byPeer, c.peer)
	} else {
		h.byPeer[c.peer] = conns
	}
}

// release forgets c as it is closed.
func (h *HTTPConns) release(c *httpConn) {
	h.mu.Lock()
	gone := c.gone
	h.forget(c)
	h.mu.Unlock()
	if !gone && h.open != nil {
		h.open.Dec()
	}
}

// refuse counts a refusal and logs it, unless one was logged less than
// refusalLogInterval ago.
func (h *HTTPConns) refuse(reason string, peer netip.Addr) {
	if h.refused != nil {
		h.refused(reason).Inc()
	}
	now, last := time.Now().UnixNano(), h.lastLog.Load()
	if now-last < int64(refusalLogInterval) || !h.lastLog.CompareAndSwap(last, now) {
		h.supp.Add(1)
		return
	}
	h.mu.Lock()
	open := h.total
	h.mu.Unlock()
	h.log.Debug("connection refused", "server", h.server, logReason, reason, logPeer, peer.String(), logOpenConns, open, logSuppressed, h.supp.Swap(0))
}

// httpConn is an admitted connection. Under its HTTPConns' mu: gone
// once it no longer counts, idle while kept alive between requests.
type httpConn struct {
	net.Conn
	h          *HTTPConns
	peer       netip.Addr
	seq        uint64 // the order of admission
	gone, idle bool
}

// Close closes the connection and, the first time, releases its place.
func (c *httpConn) Close() error {
	c.h.release(c)
	return c.Conn.Close()
}
