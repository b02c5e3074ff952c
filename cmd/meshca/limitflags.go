package main

import (
	"fmt"
	"math"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"github.com/spf13/pflag"
)

// limitFlags are the budgets per caller and per peer, and the limits of
// the gRPC server's connections. On the command line 0 turns a limit off
// (ca's zero values are its defaults, so 0 becomes limit.NoLimit).
type limitFlags struct {
	callerRate, nodeRate, peerFailRate       float64
	callerBurst, nodeBurst, peerFailBurst    int
	callerInFlight, nodeInFlight             int
	keepaliveTime, keepaliveTimeout, minPing time.Duration
	maxIdle, maxAge, maxAgeGrace             time.Duration
	maxStreams                               int
	// The connection guard: caps, handshake deadline, the limits of
	// unauthenticated connections and streams, the message deadline.
	maxConns, maxConnsPerPeer                     int
	maxUnauthConns, maxUnauthConnsPerPeer         int
	handshakeTimeout, maxUnauthIdle, maxUnauthAge time.Duration
	messageTimeout, maxUnauthCooldown             time.Duration
	maxUnauthStreams, maxUnauthStreamsPerPeer     int
}

func (f *limitFlags) register(fl *pflag.FlagSet) {
	c, n := limit.DefaultCallerBudget, limit.DefaultNodeProxyBudget
	fl.Float64Var(&f.callerRate, "caller-rate", c.Rate, "requests a second each workload identity (SPIFFE ID) may make, after --caller-burst at once; more are refused at once (ResourceExhausted, caller_rate) with a retry hint; 0: no limit")
	fl.IntVar(&f.callerBurst, "caller-burst", c.Burst, "requests a workload identity may make at once before --caller-rate applies")
	fl.IntVar(&f.callerInFlight, "caller-max-in-flight", c.MaxInFlight, "requests of one workload identity served at once; more are refused at once (caller_in_flight); 0: no limit")
	fl.Float64Var(&f.nodeRate, "node-proxy-rate", n.Rate, "requests a second each node proxy Pod (a --trusted-node-accounts caller: ztunnel, asking for the Pods of its node) may make, after --node-proxy-burst at once (node_proxy_rate); 0: no limit")
	fl.IntVar(&f.nodeBurst, "node-proxy-burst", n.Burst, "requests a node proxy Pod may make at once before --node-proxy-rate applies")
	fl.IntVar(&f.nodeInFlight, "node-proxy-max-in-flight", n.MaxInFlight, "requests of one node proxy Pod served at once; more are refused at once (node_proxy_in_flight); 0: no limit")
	fl.Float64Var(&f.peerFailRate, "authn-failure-rate-per-peer", limit.DefaultPeerFailureRate, "failed authentications (TokenReviews refused) a second one peer IP may cause, after --authn-failure-burst-per-peer; then its tokens not yet reviewed wait their turn, one per failure refilled, and only a request whose turn comes too late for its deadline is refused (peer_authn_failures); a token bound to a Pod the cluster runs, which has not failed from the address, takes its turns from a second bucket of this size that only such tokens' failures spend; reviews that succeed cost nothing, and requests that need none (a client certificate, a cached token) never wait: one client cannot lock out the others at its address; 0: no limit")
	fl.IntVar(&f.peerFailBurst, "authn-failure-burst-per-peer", limit.DefaultPeerFailureBurst, "failed authentications one peer IP may cause in a row before --authn-failure-rate-per-peer applies")
	fl.DurationVar(&f.keepaliveTime, "keepalive-time", limit.DefaultKeepaliveTime, "ping a client after this long without activity on its connection (istiod: 30s)")
	fl.DurationVar(&f.keepaliveTimeout, "keepalive-timeout", limit.DefaultKeepaliveTimeout, "close a connection whose client does not answer a ping within this long (istiod: 10s)")
	fl.DurationVar(&f.minPing, "keepalive-min-time", limit.DefaultKeepaliveMinTime, "shortest interval between a client's pings tolerated, with or without a request open; more often: GOAWAY too_many_pings (istiod: 15s; ztunnel pings every 30s)")
	fl.DurationVar(&f.maxIdle, "max-connection-idle", limit.DefaultMaxConnectionIdle, "close a connection without a request for this long (ztunnel drops its own after 90s, istio-agent after 30m); 0: never")
	fl.DurationVar(&f.maxAge, "max-connection-age", limit.DefaultMaxConnectionAge, "close a connection this old (±10%), so that clients spread over replicas again (istiod's chart: 30m); 0: never")
	fl.DurationVar(&f.maxAgeGrace, "max-connection-age-grace", 0, "time the requests of a connection closed for its age get to finish; 0: --request-timeout, so none is cut")
	fl.IntVar(&f.maxStreams, "max-concurrent-streams", limit.DefaultMaxConcurrentStreams, "requests one connection may have in progress at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; a client queues the rest); 0: no limit")
	fl.IntVar(&f.maxConns, "max-connections", limit.DefaultMaxConnections, "gRPC connections open at once; more are closed as soon as accepted, before TLS (meshca_connections_refused_total{reason=\"total\"}); about 35 KiB each: size it with the memory limit; 0: no limit")
	fl.IntVar(&f.maxConnsPerPeer, "max-connections-per-peer", limit.DefaultMaxConnectionsPerPeer, "gRPC connections open at once from one client address (exact IP); more are closed as soon as accepted (per_peer); raise it for clients behind one address (SNAT, an east-west gateway); 0: no limit")
	fl.IntVar(&f.maxUnauthConns, "max-unauthenticated-connections", limit.DefaultMaxUnauthenticatedConnections, "gRPC connections open at once on which no request has authenticated yet (handshaking included), counted in --max-connections too; up to ~150 KiB each; past it a new one closes the oldest such connection of the address holding the most if that address holds at least two more than its own (evicted_unauthenticated), else is closed at accept (unauthenticated_total); authenticated connections are never closed for it; 0: no limit")
	fl.IntVar(&f.maxUnauthConnsPerPeer, "max-unauthenticated-connections-per-peer", limit.DefaultMaxUnauthenticatedConnectionsPerPeer, "gRPC connections open at once from one client address (exact IP) on which no request has authenticated yet; more are closed as soon as accepted, before TLS (unauthenticated_per_peer); raise it for many clients behind one address that connect at once; 0: no limit")
	fl.DurationVar(&f.handshakeTimeout, "tls-handshake-timeout", limit.DefaultTLSHandshakeTimeout, "close a connection whose TLS handshake and HTTP/2 preface are not done this long after it was accepted (handshake_timeout); 0: grpc-go's 120s")
	fl.DurationVar(&f.maxUnauthIdle, "max-connection-idle-unauthenticated", limit.DefaultMaxUnauthenticatedIdle, "close a connection on which no request has authenticated yet once it has had no request in progress for this long (unauthenticated_idle); one that has gets --max-connection-idle; 0: --max-connection-idle for all")
	fl.DurationVar(&f.maxUnauthAge, "max-connection-age-unauthenticated", limit.DefaultMaxUnauthenticatedAge, "close a connection on which no request has authenticated yet this long after it was accepted, whatever it has in progress (unauthenticated_age); one that has gets --max-connection-age; 0: off")
	fl.DurationVar(&f.messageTimeout, "request-message-timeout", limit.DefaultRequestMessageTimeout, "cancel a request whose message has not arrived this long after its headers (meshca_streams_refused_total{reason=\"message_timeout\"}); clients send both at once; 0: off")
	fl.DurationVar(&f.maxUnauthCooldown, "max-unauthenticated-cooldown", limit.DefaultMaxUnauthenticatedCooldown, "an address whose unauthenticated connections meshca keeps closing (handshake_timeout, unauthenticated_idle, unauthenticated_age, streams_refused: 8 of them each time) has its new connections closed at accept, before TLS (cooling_down), for 1s, then twice as long each time it goes on, up to this; an address a request authenticated from in the last 10 minutes, or holding an authenticated connection, is never cooled, and an authentication ends its cool-down; 0: off")
	fl.IntVar(&f.maxUnauthStreams, "max-unauthenticated-streams", limit.DefaultMaxUnauthenticatedStreams, "requests in progress that have not authenticated, over all connections, each counting once more for every 4 KiB of its headers and message (~12 KiB each); past it, the oldest of the address holding the most is cancelled to make room (evicted), or, that address being the newcomer's, the newcomer refused (ResourceExhausted, total); 0: no limit")
	fl.IntVar(&f.maxUnauthStreamsPerPeer, "max-unauthenticated-streams-per-peer", limit.DefaultMaxUnauthenticatedStreamsPerPeer, "requests in progress that have not authenticated from one client address (exact IP), counted as for --max-unauthenticated-streams; more are refused before they run (ResourceExhausted, per_peer); a ztunnel asks for a 250-Pod node at once; 0: no limit")
}

// config checks the flags and returns them as ca takes them.
func (f *limitFlags) config() (limit.Limits, limit.ConnLimits, error) {
	if err := f.check(); err != nil {
		return limit.Limits{}, limit.ConnLimits{}, err
	}
	limits := limit.Limits{
		Caller:          limit.Budget{Rate: offRate(f.callerRate), Burst: f.callerBurst, MaxInFlight: off(f.callerInFlight)},
		NodeProxy:       limit.Budget{Rate: offRate(f.nodeRate), Burst: f.nodeBurst, MaxInFlight: off(f.nodeInFlight)},
		PeerFailureRate: offRate(f.peerFailRate), PeerFailureBurst: f.peerFailBurst,
	}
	idle, age := f.maxIdle, f.maxAge
	if idle == 0 {
		idle = limit.NoLimit
	}
	if age == 0 {
		age = limit.NoLimit
	}
	conn := limit.ConnLimits{
		KeepaliveTime: f.keepaliveTime, KeepaliveTimeout: f.keepaliveTimeout, KeepaliveMinTime: f.minPing,
		MaxConnectionIdle: idle, MaxConnectionAge: age, MaxConnectionAgeGrace: f.maxAgeGrace, MaxConcurrentStreams: off(f.maxStreams),
		MaxConnections: off(f.maxConns), MaxConnectionsPerPeer: off(f.maxConnsPerPeer),
		MaxUnauthenticatedConnections: off(f.maxUnauthConns), MaxUnauthenticatedConnectionsPerPeer: off(f.maxUnauthConnsPerPeer),
		TLSHandshakeTimeout: offDuration(f.handshakeTimeout), MaxUnauthenticatedIdle: offDuration(f.maxUnauthIdle),
		MaxUnauthenticatedAge: offDuration(f.maxUnauthAge), RequestMessageTimeout: offDuration(f.messageTimeout),
		MaxUnauthenticatedStreams: off(f.maxUnauthStreams), MaxUnauthenticatedStreamsPerPeer: off(f.maxUnauthStreamsPerPeer),
		MaxUnauthenticatedCooldown: offDuration(f.maxUnauthCooldown),
	}
	return limits, conn, nil
}

// check refuses the flags' values that are not limits.
func (f *limitFlags) check() error {
	for _, r := range []struct {
		name  string
		rate  float64
		burst int
	}{
		{"caller-rate", f.callerRate, f.callerBurst},
		{"node-proxy-rate", f.nodeRate, f.nodeBurst},
		{"authn-failure-rate-per-peer", f.peerFailRate, f.peerFailBurst},
	} {
		switch {
		case math.IsNaN(r.rate) || math.IsInf(r.rate, 0) || r.rate < 0:
			return fmt.Errorf("--%s %v must be a number of requests a second, at least 0 (0: no limit)", r.name, r.rate)
		case r.rate > 0 && r.burst < 1:
			return fmt.Errorf("--%s %v needs a burst of at least 1, not %d", r.name, r.rate, r.burst)
		}
	}
	switch {
	case f.callerInFlight < 0 || f.nodeInFlight < 0 || f.maxStreams < 0:
		return fmt.Errorf("--caller-max-in-flight (%d), --node-proxy-max-in-flight (%d) and --max-concurrent-streams (%d) must not be negative (0: no limit)",
			f.callerInFlight, f.nodeInFlight, f.maxStreams)
	case f.maxStreams > math.MaxUint32:
		return fmt.Errorf("--max-concurrent-streams %d is above %d", f.maxStreams, uint32(math.MaxUint32))
	case f.keepaliveTime < time.Second || f.keepaliveTimeout <= 0 || f.minPing <= 0:
		return fmt.Errorf("--keepalive-time (%v) must be at least 1s, --keepalive-timeout (%v) and --keepalive-min-time (%v) positive",
			f.keepaliveTime, f.keepaliveTimeout, f.minPing)
	case f.maxConns < 0 || f.maxConnsPerPeer < 0 || f.handshakeTimeout < 0 || f.maxUnauthIdle < 0:
		return fmt.Errorf("--max-connections (%d), --max-connections-per-peer (%d), --tls-handshake-timeout (%v) and --max-connection-idle-unauthenticated (%v) must not be negative (0: no limit)",
			f.maxConns, f.maxConnsPerPeer, f.handshakeTimeout, f.maxUnauthIdle)
	case f.maxUnauthAge < 0 || f.messageTimeout < 0 || f.maxUnauthStreams < 0 || f.maxUnauthStreamsPerPeer < 0:
		return fmt.Errorf("--max-connection-age-unauthenticated (%v), --request-message-timeout (%v), --max-unauthenticated-streams (%d) and --max-unauthenticated-streams-per-peer (%d) must not be negative (0: no limit)",
			f.maxUnauthAge, f.messageTimeout, f.maxUnauthStreams, f.maxUnauthStreamsPerPeer)
	case f.maxUnauthConns < 0 || f.maxUnauthConnsPerPeer < 0:
		return fmt.Errorf("--max-unauthenticated-connections (%d) and --max-unauthenticated-connections-per-peer (%d) must not be negative (0: no limit)",
			f.maxUnauthConns, f.maxUnauthConnsPerPeer)
	case f.maxUnauthCooldown < 0:
		return fmt.Errorf("--max-unauthenticated-cooldown (%v) must not be negative (0: off)", f.maxUnauthCooldown)
	case f.maxIdle < 0 || f.maxAge < 0 || f.maxAgeGrace < 0:
		return fmt.Errorf("--max-connection-idle (%v), --max-connection-age (%v) and --max-connection-age-grace (%v) must not be negative (0: never)",
			f.maxIdle, f.maxAge, f.maxAgeGrace)
	}
	return nil
}

// off is a limit given on the command line as ca takes it: 0, no limit,
// is limit.NoLimit.
func off(v int) int {
	if v == 0 {
		return limit.NoLimit
	}
	return v
}

func offDuration(d time.Duration) time.Duration {
	if d == 0 {
		return limit.NoLimit
	}
	return d
}

func offRate(v float64) float64 {
	if v == 0 {
		return limit.NoLimit
	}
	return v
}
