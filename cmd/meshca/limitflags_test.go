package main

import (
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"github.com/spf13/pflag"
)

// defaultLimitFlags are the limit flags at their defaults.
func defaultLimitFlags() limitFlags {
	var f limitFlags
	f.register(pflag.NewFlagSet("limits", pflag.ContinueOnError))
	return f
}

// TestLimitFlags: the limit flags reach ca's Limits and ConnLimits from
// every source, 0 turns a limit off, and bad values are refused naming
// the flag and where it came from.
func TestLimitFlags(t *testing.T) {
	defaults := limit.Limits{
		Caller: limit.DefaultCallerBudget, NodeProxy: limit.DefaultNodeProxyBudget,
		PeerFailureRate: limit.DefaultPeerFailureRate, PeerFailureBurst: limit.DefaultPeerFailureBurst,
	}
	defaultConn := limit.ConnLimits{
		KeepaliveTime: 30 * time.Second, KeepaliveTimeout: 10 * time.Second, KeepaliveMinTime: 15 * time.Second,
		MaxConnectionIdle: 30 * time.Minute, MaxConnectionAge: 30 * time.Minute, MaxConcurrentStreams: 256,
		MaxConnections: 4096, MaxConnectionsPerPeer: 256, MaxUnauthenticatedConnections: 512, MaxUnauthenticatedConnectionsPerPeer: 64, TLSHandshakeTimeout: 5 * time.Second, MaxUnauthenticatedIdle: 30 * time.Second,
		MaxUnauthenticatedAge: time.Minute, RequestMessageTimeout: 5 * time.Second, MaxUnauthenticatedStreams: 4096, MaxUnauthenticatedStreamsPerPeer: 256,
		MaxUnauthenticatedCooldown: 30 * time.Second,
	}
	tests := []struct {
		name   string
		args   []string
		env    []string
		file   string
		limits func(*limit.Limits)
		conn   func(*limit.ConnLimits)
		err    string
	}{
		{name: "defaults"},
		{name: "flags", args: []string{"--caller-rate", "2.5", "--caller-burst", "7", "--node-proxy-max-in-flight", "64", "--max-connection-age-grace", "45s"},
			limits: func(l *limit.Limits) { l.Caller.Rate, l.Caller.Burst, l.NodeProxy.MaxInFlight = 2.5, 7, 64 },
			conn:   func(c *limit.ConnLimits) { c.MaxConnectionAgeGrace = 45 * time.Second }},
		{name: "MESHCA_ variables", env: []string{"MESHCA_NODE_PROXY_RATE=500", "MESHCA_KEEPALIVE_TIME=1m", "MESHCA_MAX_CONCURRENT_STREAMS=1000"},
			limits: func(l *limit.Limits) { l.NodeProxy.Rate = 500 },
			conn:   func(c *limit.ConnLimits) { c.KeepaliveTime, c.MaxConcurrentStreams = time.Minute, 1000 }},
		{name: "config file", file: "authnFailureRatePerPeer: 1\nauthnFailureBurstPerPeer: 5\nmaxConnectionIdle: 5m\ncallerMaxInFlight: 8\n",
			limits: func(l *limit.Limits) { l.PeerFailureRate, l.PeerFailureBurst, l.Caller.MaxInFlight = 1, 5, 8 },
			conn:   func(c *limit.ConnLimits) { c.MaxConnectionIdle = 5 * time.Minute }},
		{name: "0 turns limits off",
			args: []string{"--caller-rate", "0", "--caller-max-in-flight", "0", "--node-proxy-rate", "0", "--authn-failure-rate-per-peer", "0",
				"--max-connection-idle", "0", "--max-connection-age", "0", "--max-concurrent-streams", "0"},
			limits: func(l *limit.Limits) {
				l.Caller.Rate, l.Caller.MaxInFlight, l.NodeProxy.Rate, l.PeerFailureRate = limit.NoLimit, limit.NoLimit, limit.NoLimit, limit.NoLimit
			},
			conn: func(c *limit.ConnLimits) {
				c.MaxConnectionIdle, c.MaxConnectionAge, c.MaxConcurrentStreams = limit.NoLimit, limit.NoLimit, limit.NoLimit
			}},
		{name: "connection guard", args: []string{"--max-connections", "10000", "--max-connections-per-peer", "0", "--tls-handshake-timeout", "0"},
			file: "maxConnectionIdleUnauthenticated: 30s\n",
			conn: func(c *limit.ConnLimits) {
				c.MaxConnections, c.MaxConnectionsPerPeer, c.TLSHandshakeTimeout, c.MaxUnauthenticatedIdle = 10000, limit.NoLimit, limit.NoLimit, 30*time.Second
			}},
		{name: "unauthenticated connections and streams", args: []string{"--max-connection-age-unauthenticated", "2m", "--request-message-timeout", "0"},
			env:  []string{"MESHCA_MAX_UNAUTHENTICATED_STREAMS_PER_PEER=512"},
			file: "maxUnauthenticatedStreams: 0\n",
			conn: func(c *limit.ConnLimits) {
				c.MaxUnauthenticatedAge, c.RequestMessageTimeout, c.MaxUnauthenticatedStreamsPerPeer, c.MaxUnauthenticatedStreams = 2*time.Minute, limit.NoLimit, 512, limit.NoLimit
			}},
		{name: "unauthenticated connection caps", args: []string{"--max-unauthenticated-connections", "1024"},
			env: []string{"MESHCA_MAX_UNAUTHENTICATED_CONNECTIONS_PER_PEER=0"},
			conn: func(c *limit.ConnLimits) {
				c.MaxUnauthenticatedConnections, c.MaxUnauthenticatedConnectionsPerPeer = 1024, limit.NoLimit
			}},
		{name: "unauthenticated connection caps from the config file", file: "maxUnauthenticatedConnections: 0\nmaxUnauthenticatedConnectionsPerPeer: 16\n",
			conn: func(c *limit.ConnLimits) {
				c.MaxUnauthenticatedConnections, c.MaxUnauthenticatedConnectionsPerPeer = limit.NoLimit, 16
			}},
		{name: "cool-down", args: []string{"--max-unauthenticated-cooldown", "2m"},
			conn: func(c *limit.ConnLimits) { c.MaxUnauthenticatedCooldown = 2 * time.Minute }},
		{name: "cool-down off", file: "maxUnauthenticatedCooldown: 0s\n",
			conn: func(c *limit.ConnLimits) { c.MaxUnauthenticatedCooldown = limit.NoLimit }},
		{name: "negative cool-down", env: []string{"MESHCA_MAX_UNAUTHENTICATED_COOLDOWN=-1s"}, err: "--max-unauthenticated-cooldown (-1s) must not be negative (0: off)"},
		{name: "negative unauthenticated connection cap", file: "maxUnauthenticatedConnectionsPerPeer: -4\n", err: "--max-unauthenticated-connections-per-peer (-4) must not be negative"},
		{name: "negative stream cap", args: []string{"--max-unauthenticated-streams", "-2"}, err: "--max-unauthenticated-streams (-2)"},
		{name: "negative message timeout", file: "requestMessageTimeout: -1s\n", err: "--request-message-timeout (-1s)"},
		{name: "negative connection cap", env: []string{"MESHCA_MAX_CONNECTIONS_PER_PEER=-1"}, err: "--max-connections-per-peer (-1)"},
		{name: "negative rate", args: []string{"--caller-rate", "-1"}, err: "--caller-rate -1 must be a number of requests a second, at least 0"},
		{name: "NaN rate", env: []string{"MESHCA_NODE_PROXY_RATE=NaN"}, err: "--node-proxy-rate NaN must be a number of requests a second, at least 0 (0: no limit) (--node-proxy-rate from env MESHCA_NODE_PROXY_RATE)"},
		{name: "rate without burst", args: []string{"--node-proxy-burst", "0"}, err: "--node-proxy-rate 200 needs a burst of at least 1, not 0"},
		{name: "negative in-flight", file: "callerMaxInFlight: -3\n", err: "--caller-max-in-flight (-3)"},
		{name: "keepalive below a second", args: []string{"--keepalive-time", "100ms"}, err: "--keepalive-time (100ms) must be at least 1s"},
		{name: "negative idle", args: []string{"--max-connection-idle", "-1s"}, err: "--max-connection-idle (-1s)"},
		{name: "not a number", env: []string{"MESHCA_CALLER_BURST=lots"}, err: `MESHCA_CALLER_BURST="lots": --caller-burst`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--state-dir", "/tmp/x"}, tt.args...)
			if tt.file != "" {
				args = append(args, "--config", writeConfig(t, tt.file))
			}
			f, s, err := resolveServe(t, args, tt.env...)
			if err == nil {
				c, verr := f.validate()
				err = s.explain(verr)
				if err == nil {
					want, wantConn := defaults, defaultConn
					if tt.limits != nil {
						tt.limits(&want)
					}
					if tt.conn != nil {
						tt.conn(&wantConn)
					}
					if c.Limits != want || c.Conn != wantConn {
						t.Fatalf("got %+v %+v\nwant %+v %+v", c.Limits, c.Conn, want, wantConn)
					}
				}
			}
			switch {
			case tt.err == "" && err != nil:
				t.Fatal(err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("err = %v, want %q", err, tt.err)
			}
		})
	}
}
