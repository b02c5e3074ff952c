package limit

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// ConnLimits bound the server's connections: how many, HTTP/2 keepalive,
// handshake, idle and age limits, and the streams of one connection and
// of the connections that have not authenticated. Zero fields take the
// defaults below; NoLimit turns MaxConnections, MaxConnectionsPerPeer,
// MaxUnauthenticatedConnections(PerPeer), TLSHandshakeTimeout, MaxUnauthenticatedIdle, MaxUnauthenticatedAge,
// RequestMessageTimeout, MaxUnauthenticatedStreams(PerPeer),
// MaxHealthWatches(PerPeer), MaxUnauthenticatedCooldown,
// MaxConnectionIdle, MaxConnectionAge or
// MaxConcurrentStreams off. The caps, the handshake deadline, the limits
// of unauthenticated connections and streams and the request message
// deadline are ConnGuard's, in front of the gRPC server's listener and
// as its tap and stats handler; the others are grpc-go's.
//
// ztunnel and istio-agent keep one connection to the CA and use it
// rarely: ztunnel's client drops it itself after 90 s without a request
// and pings every 30 s while a request is open; istio-agent's grpc-go
// channel drops it after 30 minutes idle and sends no pings. The defaults
// neither close a connection one of them would still use nor refuse
// their pings. They follow istiod's gRPC server where it sets a value
// (keepalive every 30 s, 10 s to answer, pings every 15 s tolerated,
// connections recycled after 30 minutes).
type ConnLimits struct {
	// KeepaliveTime: after this long without activity on a connection
	// the server pings the client, and closes the connection if no
	// answer comes within KeepaliveTimeout, so that the connection of a
	// vanished peer does not linger.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// KeepaliveMinTime is the shortest interval between a client's pings
	// that the server tolerates, with or without a request open; a client
	// pinging more often is sent GOAWAY (too_many_pings).
	KeepaliveMinTime time.Duration
	// MaxConnectionIdle closes (GOAWAY) a connection that has had no
	// request for this long.
	MaxConnectionIdle time.Duration
	// MaxConnectionAge closes a connection this old (grpc-go adds ±10%
	// jitter), so that clients spread over replicas again; its requests
	// in progress get MaxConnectionAgeGrace to finish, then it is cut.
	// A zero grace is RequestTimeout: no request is cut.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// MaxConcurrentStreams bounds the requests of one connection in
	// progress at once (SETTINGS_MAX_CONCURRENT_STREAMS): a client queues
	// the others itself.
	MaxConcurrentStreams int
	// MaxConnections bounds the connections open at once, and
	// MaxConnectionsPerPeer those of one client address (its exact IP): a
	// connection past either is closed as soon as it is accepted, before
	// its TLS handshake.
	MaxConnections, MaxConnectionsPerPeer int
	// MaxUnauthenticatedConnections bounds the connections open at once
	// that have not authenticated (yet), from their accept until one of
	// their requests authenticates, and
	// MaxUnauthenticatedConnectionsPerPeer those of one client address;
	// they count against MaxConnections(PerPeer) too. A connection past
	// the address's cap is refused at accept, before its TLS handshake.
	// Past the total, the oldest such connection of the address holding
	// the most is closed in its place if that address holds at least two
	// more than the newcomer's, else the newcomer is refused at accept:
	// a client from an address holding fewer is never refused, addresses
	// within one of each other do not take each other's places (a flood's
	// every dial would cost a TLS handshake), and an authenticated
	// connection is never closed.
	MaxUnauthenticatedConnections, MaxUnauthenticatedConnectionsPerPeer int
	// TLSHandshakeTimeout bounds a connection's TLS handshake and HTTP/2
	// preface, from its accept.
	TLSHandshakeTimeout time.Duration
	// MaxUnauthenticatedIdle closes a connection none of whose requests
	// has authenticated once it has had no RPC in progress for this long.
	// A connection on which a request authenticated is closed after
	// MaxConnectionIdle instead.
	MaxUnauthenticatedIdle time.Duration
	// MaxUnauthenticatedAge closes a connection none of whose requests
	// has authenticated this long after it was accepted, whatever it has
	// in progress.
	MaxUnauthenticatedAge time.Duration
	// RequestMessageTimeout cancels a stream whose request message has
	// not arrived this long after its headers, whoever sent them.
	RequestMessageTimeout time.Duration
	// MaxUnauthenticatedStreams bounds the streams in progress whose
	// request has not authenticated, over all connections, and
	// MaxUnauthenticatedStreamsPerPeer those of one client address, a
	// stream counting once more for each StreamHeaderUnit of its headers
	// and of its message. A stream past the address's cap is refused
	// before it costs a goroutine; past the total, the oldest such stream
	// of the address holding the most is cancelled to make room, unless
	// the newcomer's own address holds as many.
	MaxUnauthenticatedStreams, MaxUnauthenticatedStreamsPerPeer int
	// MaxHealthWatches bounds the grpc.health.v1.Health/Watch streams
	// open at once, and MaxHealthWatchesPerPeer those of one address.
	MaxHealthWatches, MaxHealthWatchesPerPeer int
	// MaxUnauthenticatedCooldown is the longest an address whose
	// unauthenticated connections the guard keeps closing has its new
	// connections refused at accept (connguard_cooldown.go).
	MaxUnauthenticatedCooldown time.Duration
}

// Defaults of ConnLimits.
const (
	DefaultKeepaliveTime     = 30 * time.Second
	DefaultKeepaliveTimeout  = 10 * time.Second
	DefaultKeepaliveMinTime  = 15 * time.Second
	DefaultMaxConnectionIdle = 30 * time.Minute
	DefaultMaxConnectionAge  = 30 * time.Minute
	// DefaultMaxConcurrentStreams lets a ztunnel ask for every Pod of a
	// node with 250 Pods at once on its one connection.
	DefaultMaxConcurrentStreams = 256
	// DefaultMaxConnections keeps the connections of one replica within
	// the chart's 256 MiB memory limit: an idle connection costs ~36 KiB,
	// and 4096 of them hold meshca at ~210 MiB of RSS
	// (BenchmarkIdleConnectionsAtCap), which leaves ~45 MiB for
	// requests, the Pod index and the garbage collector's headroom. A
	// mesh holds one connection per ztunnel (one a node) and per
	// istio-agent (one a sidecar or gateway Pod), spread over the
	// replicas.
	DefaultMaxConnections = 4096
	// DefaultMaxConnectionsPerPeer lets one address hold a node's worth
	// of connections (kubelet's default 110 Pods, 250 on managed
	// platforms), as clients behind a node's SNAT do, while one client
	// alone can take no more than a sixteenth of DefaultMaxConnections.
	DefaultMaxConnectionsPerPeer = 256
	// DefaultMaxUnauthenticatedConnections: a connection that has not
	// authenticated is one a client without credentials can hold, and
	// costs more than an idle authenticated one: up to ~150 KiB with its
	// TLS and HTTP/2 state and grpc-go's goroutines, so 512 of them hold
	// ~75 MiB at most. Sixteen addresses under their per-address caps
	// took ~3,500 connections of --max-connections and 330-370 MiB of a
	// replica before it (TestSoak). A client authenticates with its
	// first request, milliseconds after its handshake: a mesh holds
	// few connections in that state at once, whatever its size.
	DefaultMaxUnauthenticatedConnections = 512
	// DefaultMaxUnauthenticatedConnectionsPerPeer: Pods behind one
	// address (a node's SNAT) reconnecting at once each hold one for the
	// milliseconds of their handshake and first request; one client
	// alone holds at most an eighth of DefaultMaxUnauthenticatedConnections.
	DefaultMaxUnauthenticatedConnectionsPerPeer = 64
	// DefaultTLSHandshakeTimeout is ample for a handshake over a slow
	// link (a few round trips), and 24 times shorter than grpc-go's
	// 120 s: a connection that never finishes its handshake holds a slot
	// of MaxConnections at most this long.
	DefaultTLSHandshakeTimeout = 5 * time.Second
	// DefaultMaxUnauthenticatedIdle: ztunnel and istio-agent connect to
	// send a request and send it at once; a kubelet gRPC probe closes its
	// connection after its check.
	DefaultMaxUnauthenticatedIdle = 30 * time.Second
	// DefaultMaxUnauthenticatedAge: a client with credentials
	// authenticates with its first request, within its request timeout;
	// a tool watching the health service reconnects.
	DefaultMaxUnauthenticatedAge = time.Minute
	// DefaultRequestMessageTimeout: every client sends its request
	// message with its headers.
	DefaultRequestMessageTimeout = 5 * time.Second
	// DefaultMaxUnauthenticatedStreamsPerPeer lets a ztunnel ask for
	// every Pod of a 250-Pod node at once on a fresh connection, before
	// its token is reviewed.
	DefaultMaxUnauthenticatedStreamsPerPeer = 256
	// DefaultMaxUnauthenticatedStreams: a stream waiting for its message
	// or its authentication costs ~12 KiB (its goroutine, grpc-go's state,
	// its headers), so 4096 of them hold ~50 MiB.
	DefaultMaxUnauthenticatedStreams = 4096
	// DefaultMaxHealthWatches and DefaultMaxHealthWatchesPerPeer: a probe
	// (kubelet's included) uses Check; only tools watch.
	DefaultMaxHealthWatches        = 64
	DefaultMaxHealthWatchesPerPeer = 4
	// DefaultMaxUnauthenticatedCooldown: a flood's address reaches it
	// after five cool-downs in a row (1+2+4+8+16 s), and is then let
	// back in twice a minute; an address that authenticates is never
	// cooled.
	DefaultMaxUnauthenticatedCooldown = 30 * time.Second
)

// WithDefaults is c with its zero fields set to the defaults above; a
// zero MaxConnectionAgeGrace is requestTimeout.
func (c ConnLimits) WithDefaults(requestTimeout time.Duration) ConnLimits {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.KeepaliveTime, DefaultKeepaliveTime)
	def(&c.KeepaliveTimeout, DefaultKeepaliveTimeout)
	def(&c.KeepaliveMinTime, DefaultKeepaliveMinTime)
	def(&c.MaxConnectionIdle, DefaultMaxConnectionIdle)
	def(&c.MaxConnectionAge, DefaultMaxConnectionAge)
	def(&c.MaxConnectionAgeGrace, requestTimeout)
	def(&c.TLSHandshakeTimeout, DefaultTLSHandshakeTimeout)
	def(&c.MaxUnauthenticatedIdle, DefaultMaxUnauthenticatedIdle)
	def(&c.MaxUnauthenticatedAge, DefaultMaxUnauthenticatedAge)
	def(&c.RequestMessageTimeout, DefaultRequestMessageTimeout)
	def(&c.MaxUnauthenticatedCooldown, DefaultMaxUnauthenticatedCooldown)
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	defInt(&c.MaxConcurrentStreams, DefaultMaxConcurrentStreams)
	defInt(&c.MaxConnections, DefaultMaxConnections)
	defInt(&c.MaxConnectionsPerPeer, DefaultMaxConnectionsPerPeer)
	defInt(&c.MaxUnauthenticatedConnections, DefaultMaxUnauthenticatedConnections)
	defInt(&c.MaxUnauthenticatedConnectionsPerPeer, DefaultMaxUnauthenticatedConnectionsPerPeer)
	defInt(&c.MaxUnauthenticatedStreams, DefaultMaxUnauthenticatedStreams)
	defInt(&c.MaxUnauthenticatedStreamsPerPeer, DefaultMaxUnauthenticatedStreamsPerPeer)
	defInt(&c.MaxHealthWatches, DefaultMaxHealthWatches)
	defInt(&c.MaxHealthWatchesPerPeer, DefaultMaxHealthWatchesPerPeer)
	return c
}

// ServerOptions are c as grpc-go takes them, where zero means no limit.
func (c ConnLimits) ServerOptions() []grpc.ServerOption {
	off := func(d time.Duration) time.Duration { return max(d, 0) }
	streams := uint32(0)
	if c.MaxConcurrentStreams > 0 {
		streams = uint32(c.MaxConcurrentStreams)
	}
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     off(c.MaxConnectionIdle),
			MaxConnectionAge:      off(c.MaxConnectionAge),
			MaxConnectionAgeGrace: off(c.MaxConnectionAgeGrace),
			Time:                  c.KeepaliveTime,
			Timeout:               c.KeepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: c.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(streams),
		// An idle connection holds no buffer of its own: frames are read
		// straight from the TLS connection (which buffers a record
		// anyway), and the write buffer comes from a shared pool while a
		// frame is written (grpc-go's default since it deprecated
		// SharedWriteBuffer). A 32 KiB read buffer each made 10,000 idle
		// connections cost 597 MiB of RSS instead of the 300 MiB budget
		// (TestIdleConnections).
		grpc.ReadBufferSize(0),
	}
}
