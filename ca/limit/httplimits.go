package limit

import (
	"net/http"
	"time"
)

// HTTPLimits bound an HTTP server that answers anyone who reaches its
// port without credentials: meshca's admin port (/metrics, /healthz,
// /readyz, the profiles) and its SPIFFE bundle endpoint. Zero fields take
// the defaults below; NoLimit turns MaxConnections or
// MaxConnectionsPerPeer off. The timeouts and the header bound are
// net/http's (Server); the caps are HTTPConns', in front of the server's
// listener.
//
// Their clients make one short request at a time: a kubelet probe (a
// new connection each time, answered in milliseconds, timeoutSeconds 1
// by default), Prometheus (a scrape every 15 to 60 s, its timeout 10 s by
// default; /metrics is a few hundred KiB at most), `meshca root status`,
// and a federated control plane fetching the bundle every few minutes.
// None needs a connection kept between its requests, so an idle one is
// closed soon: a client reconnects for its next request.
type HTTPLimits struct {
	// ReadHeaderTimeout bounds the reading of a request's line and
	// headers from its first byte; for a connection's first request, from
	// the accept, its TLS handshake included.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds the reading of a whole request, body included.
	ReadTimeout time.Duration
	// WriteTimeout bounds an answer, from the end of its request's
	// headers to its last byte: a client that reads it too slowly is cut
	// off. A CPU profile or trace adds its own seconds (net/http/pprof).
	WriteTimeout time.Duration
	// IdleTimeout closes a kept-alive connection that has sent no next
	// request for this long.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's line and headers: larger ones
	// get 431 Request Header Fields Too Large (net/http reads 4 KiB more
	// before it decides).
	MaxHeaderBytes int
	// MaxConnections bounds the connections open at once, and
	// MaxConnectionsPerPeer those of one client address (its exact IP).
	// At either cap a new connection takes the place of an idle one or of
	// one of an address holding more than its share, or is closed as soon
	// as it is accepted (HTTPConns).
	MaxConnections, MaxConnectionsPerPeer int
}

// Defaults of HTTPLimits.
const (
	// DefaultHTTPReadHeaderTimeout: a client's request line and headers
	// are a few hundred bytes, sent at once.
	DefaultHTTPReadHeaderTimeout = 5 * time.Second
	// DefaultHTTPReadTimeout: no request to these servers has a body.
	DefaultHTTPReadTimeout = 10 * time.Second
	// DefaultHTTPWriteTimeout is three times Prometheus's default scrape
	// timeout: a scrape configured with a longer timeout than the default
	// still gets its answer.
	DefaultHTTPWriteTimeout = 30 * time.Second
	// DefaultHTTPIdleTimeout is shorter than the 15 s between
	// Prometheus's scrapes at the shortest usual interval, so that its
	// connection is closed between them, never as it sends a scrape.
	DefaultHTTPIdleTimeout = 10 * time.Second
	// DefaultHTTPMaxHeaderBytes leaves room for a bearer token in a
	// scrape's Authorization header.
	DefaultHTTPMaxHeaderBytes = 8 << 10
	// DefaultHTTPMaxConnections is far above what the clients above
	// hold at once (a few), and 128 connections, each ~20 KiB idle,
	// hold ~3 MiB.
	DefaultHTTPMaxConnections = 128
	// DefaultHTTPMaxConnectionsPerPeer lets one address (a Prometheus, a
	// node's kubelet) hold several connections, and one client alone no
	// more than an eighth of the total.
	DefaultHTTPMaxConnectionsPerPeer = 16
)

// WithDefaults is l with its zero fields set to the defaults above.
func (l HTTPLimits) WithDefaults() HTTPLimits {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&l.ReadHeaderTimeout, DefaultHTTPReadHeaderTimeout)
	def(&l.ReadTimeout, DefaultHTTPReadTimeout)
	def(&l.WriteTimeout, DefaultHTTPWriteTimeout)
	def(&l.IdleTimeout, DefaultHTTPIdleTimeout)
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	defInt(&l.MaxHeaderBytes, DefaultHTTPMaxHeaderBytes)
	defInt(&l.MaxConnections, DefaultHTTPMaxConnections)
	defInt(&l.MaxConnectionsPerPeer, DefaultHTTPMaxConnectionsPerPeer)
	return l
}

// Server is an http.Server serving h under l's timeouts and header bound
// (zero fields taking the defaults); HTTPConns.Attach caps its
// connections.
func (l HTTPLimits) Server(h http.Handler) *http.Server {
	l = l.WithDefaults()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}
