package limit

import (
	"net"
	"testing"
)

// TestConnGuardUnauthenticatedBudget: connections not yet authenticated
// have a budget of their own, far below MaxConnections. Past the
// address's cap a newcomer is refused at accept; past the total, the
// oldest connection not yet authenticated of the address holding the
// most is closed in its place if that address holds at least two more
// than the newcomer's, else the newcomer is refused. Authenticated
// connections neither count nor are closed. Before it, sixteen addresses
// each under MaxConnectionsPerPeer held nearly all of MaxConnections
// without a token (issue 28).
func TestConnGuardUnauthenticatedBudget(t *testing.T) {
	const a, b, c = "127.0.0.1", "127.0.0.2", "127.0.0.3"
	with := func(total, perPeer int) ConnLimits {
		return ConnLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: NoLimit,
			MaxUnauthenticatedConnections: total, MaxUnauthenticatedConnectionsPerPeer: perPeer}
	}
	many := func(from string, n int) []string {
		s := make([]string, n)
		for i := range s {
			s[i] = from
		}
		return s
	}
	tests := []struct {
		name       string
		lim        ConnLimits
		from       []string
		authed     []int // indexes into from, authenticated once admitted
		refused    []int // indexes into from, refused at accept
		closed     []int // indexes into from, closed to make room
		reasons    map[string]float64
		wantOpen   int
		wantUnauth int
	}{
		{name: "per address: refused at accept", lim: with(NoLimit, 3),
			from: []string{a, a, a, a, b, b, b, a}, refused: []int{3, 7},
			reasons: map[string]float64{"unauthenticated_per_peer": 2}, wantOpen: 6, wantUnauth: 6},
		{name: "per address: authenticated connections do not count", lim: with(NoLimit, 3),
			from: []string{a, a, a, a, a}, authed: []int{0}, refused: []int{4},
			reasons: map[string]float64{"unauthenticated_per_peer": 1}, wantOpen: 4, wantUnauth: 3},
		{name: "total: an address holding two fewer takes the place of the heaviest's oldest", lim: with(4, NoLimit),
			from: []string{a, a, a, b, c, b, c}, closed: []int{0}, refused: []int{5, 6},
			reasons: map[string]float64{"evicted_unauthenticated": 1, "unauthenticated_total": 2}, wantOpen: 4, wantUnauth: 4},
		{name: "total: the newcomer's own address holding the most is refused", lim: with(4, NoLimit),
			from: []string{a, a, b, b, a}, refused: []int{4},
			reasons: map[string]float64{"unauthenticated_total": 1}, wantOpen: 4, wantUnauth: 4},
		{name: "total: authenticated connections are never closed", lim: with(3, NoLimit),
			from: []string{a, a, a, a, a, b, c}, authed: []int{0, 1}, closed: []int{2, 3},
			reasons: map[string]float64{"evicted_unauthenticated": 2}, wantOpen: 5, wantUnauth: 3},
		{name: "the cap of all connections of an address first", lim: ConnLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: 2, MaxUnauthenticatedConnectionsPerPeer: 2},
			from: []string{a, a, a}, refused: []int{2},
			reasons: map[string]float64{"per_peer": 1}, wantOpen: 2, wantUnauth: 2},
		{name: "default per address", lim: ConnLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: NoLimit},
			from: many(a, DefaultMaxUnauthenticatedConnectionsPerPeer+1), refused: []int{DefaultMaxUnauthenticatedConnectionsPerPeer},
			reasons:  map[string]float64{"unauthenticated_per_peer": 1},
			wantOpen: DefaultMaxUnauthenticatedConnectionsPerPeer, wantUnauth: DefaultMaxUnauthenticatedConnectionsPerPeer},
		{name: "no limits", lim: with(NoLimit, NoLimit), from: many(a, DefaultMaxUnauthenticatedConnectionsPerPeer+1),
			wantOpen: DefaultMaxUnauthenticatedConnectionsPerPeer + 1, wantUnauth: DefaultMaxUnauthenticatedConnectionsPerPeer + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := listenGuarded(t, tt.lim)
			authed, refused, closedWant := map[int]bool{}, map[int]bool{}, map[int]bool{}
			for _, i := range tt.authed {
				authed[i] = true
			}
			for _, i := range tt.refused {
				refused[i] = true
			}
			for _, i := range tt.closed {
				closedWant[i] = true
			}
			conns := make([]net.Conn, len(tt.from))
			for i, from := range tt.from {
				sc, ok := s.dialFrom(t, from)
				if ok == refused[i] {
					t.Fatalf("connection %d from %s: admitted %v, want %v", i, from, ok, !refused[i])
				}
				conns[i] = sc
				if ok && authed[i] {
					ConnAuthenticated(served(sc.(*guardedConn).g, sc))
				}
			}
			for i, sc := range conns {
				if sc != nil && closed(sc) != closedWant[i] {
					t.Errorf("connection %d from %s: closed %v, want %v", i, tt.from[i], closed(sc), closedWant[i])
				}
			}
			wantSample(t, s.reg, "meshca_connections_open", nil, float64(tt.wantOpen))
			wantSample(t, s.reg, "meshca_connections_unauthenticated", nil, float64(tt.wantUnauth))
			for _, r := range []string{"total", "per_peer", "evicted", "evicted_unauthenticated", "unauthenticated_total", "unauthenticated_per_peer"} {
				wantSample(t, s.reg, "meshca_connections_refused_total", map[string]string{"reason": r}, tt.reasons[r])
			}
		})
	}
}
