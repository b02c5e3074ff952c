package main

import (
	"fmt"

	"github.com/meshca/meshca/ca/limit"
	"github.com/spf13/pflag"
)

// adminFlags are the caps of the admin port's connections (--admin-listen),
// which anyone who reaches it may open without credentials. Its timeouts
// and header bound are limit.HTTPLimits' defaults. 0 turns a cap off.
type adminFlags struct {
	maxConns, maxConnsPerPeer int
}

func (a *adminFlags) register(fl *pflag.FlagSet) {
	fl.IntVar(&a.maxConns, "admin-max-connections", limit.DefaultHTTPMaxConnections, "connections open at once on --admin-listen; past it a new one takes the place of one of the address holding the most, or is closed at accept when every address holds one (meshca_http_connections_refused_total{server=\"admin\"}); 0: no limit")
	fl.IntVar(&a.maxConnsPerPeer, "admin-max-connections-per-peer", limit.DefaultHTTPMaxConnectionsPerPeer, "connections open at once on --admin-listen from one client address (exact IP); past it a new one takes the place of the address's oldest idle one, or is closed at accept; 0: no limit")
}

// config checks the flags and returns the admin port's limits.
func (a *adminFlags) config() (limit.HTTPLimits, error) {
	if a.maxConns < 0 || a.maxConnsPerPeer < 0 {
		return limit.HTTPLimits{}, fmt.Errorf("--admin-max-connections (%d) and --admin-max-connections-per-peer (%d) must not be negative (0: no limit)",
			a.maxConns, a.maxConnsPerPeer)
	}
	return limit.HTTPLimits{MaxConnections: off(a.maxConns), MaxConnectionsPerPeer: off(a.maxConnsPerPeer)}, nil
}
