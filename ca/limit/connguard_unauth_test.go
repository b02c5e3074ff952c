package limit

import (
	"net"
	"testing"
)

// TestConnGuardUnauthenticatedBudget: connections not yet authenticated
// have a budget of their own, far below MaxConnections. Past it a
// newcomer is always admitted, and the oldest connection not yet
// authenticated of its own address (past the address's cap) or of the
// address holding the most (past the total, its own when it holds as
// many) is closed; authenticated connections neither count nor are
// closed. Before it, sixteen addresses each under MaxConnectionsPerPeer
// held nearly all of MaxConnections without a token (issue 28).
func TestConnGuardUnauthenticatedBudget(t *testing.T) {
	const a, b, c = "127.0.0.1", "127.0.0.2", "127.0.0.3"
	open := ConnLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: NoLimit}
	with := func(total, perPeer int) ConnLimits {
		l := open
		l.MaxUnauthenticatedConnections, l.MaxUnauthenticatedConnectionsPerPeer = total, perPeer
		return l
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
		closed     []int // indexes into from, closed to make room
		reasons    map[string]float64
		wantOpen   int
		wantUnauth int
	}{
		{name: "per address: a newcomer takes its address's oldest's place", lim: with(NoLimit, 3),
			from: []string{a, a, a, a, b, b, b, a}, closed: []int{0, 1},
			reasons: map[string]float64{"evicted_unauthenticated_per_peer": 2}, wantOpen: 6, wantUnauth: 6},
		{name: "per address: authenticated connections do not count", lim: with(NoLimit, 3),
			from: []string{a, a, a, a, a}, authed: []int{0}, closed: []int{1},
			reasons: map[string]float64{"evicted_unauthenticated_per_peer": 1}, wantOpen: 4, wantUnauth: 3},
		{name: "total: the address holding the most gives up its oldest", lim: with(4, NoLimit),
			from: []string{a, a, b, a, c, b, a}, closed: []int{0, 1, 2},
			reasons: map[string]float64{"evicted_unauthenticated": 3}, wantOpen: 4, wantUnauth: 4},
		{name: "total: the newcomer's own address when it holds as many as any", lim: with(4, NoLimit),
			from: []string{a, a, b, b, a, b}, closed: []int{0, 2},
			reasons: map[string]float64{"evicted_unauthenticated": 2}, wantOpen: 4, wantUnauth: 4},
		{name: "total: authenticated connections are never closed", lim: with(3, NoLimit),
			from: []string{a, a, a, a, a, b, c}, authed: []int{0, 1}, closed: []int{2, 3},
			reasons: map[string]float64{"evicted_unauthenticated": 2}, wantOpen: 5, wantUnauth: 3},
		{name: "the cap of all connections of an address still refuses", lim: ConnLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: 2, MaxUnauthenticatedConnectionsPerPeer: 2},
			from: []string{a, a, a}, closed: []int{2},
			reasons: map[string]float64{"per_peer": 1}, wantOpen: 2, wantUnauth: 2},
		{name: "default per address", lim: ConnLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: NoLimit},
			from: many(a, DefaultMaxUnauthenticatedConnectionsPerPeer+1), closed: []int{0},
			reasons:  map[string]float64{"evicted_unauthenticated_per_peer": 1},
			wantOpen: DefaultMaxUnauthenticatedConnectionsPerPeer, wantUnauth: DefaultMaxUnauthenticatedConnectionsPerPeer},
		{name: "no limits", lim: with(NoLimit, NoLimit), from: many(a, DefaultMaxUnauthenticatedConnectionsPerPeer+1),
			wantOpen: DefaultMaxUnauthenticatedConnectionsPerPeer + 1, wantUnauth: DefaultMaxUnauthenticatedConnectionsPerPeer + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := listenGuarded(t, tt.lim)
			authed, closedWant := map[int]bool{}, map[int]bool{}
			for _, i := range tt.authed {
				authed[i] = true
			}
			for _, i := range tt.closed {
				closedWant[i] = true
			}
			conns := make([]net.Conn, len(tt.from))
			for i, from := range tt.from {
				sc, ok := s.dialFrom(t, from)
				if !ok {
					if reason := tt.reasons["per_peer"]; reason > 0 && closedWant[i] {
						continue // refused at accept
					}
					t.Fatalf("connection %d from %s refused", i, from)
				}
				conns[i] = sc
				if authed[i] {
					gc := sc.(*guardedConn)
					ConnAuthenticated(served(gc.g, sc))
				}
			}
			for i, sc := range conns {
				if sc != nil && closed(sc) != closedWant[i] {
					t.Errorf("connection %d from %s: closed %v, want %v", i, tt.from[i], closed(sc), closedWant[i])
				}
			}
			wantSample(t, s.reg, "meshca_connections_open", nil, float64(tt.wantOpen))
			wantSample(t, s.reg, "meshca_connections_unauthenticated", nil, float64(tt.wantUnauth))
			for _, r := range []string{"total", "per_peer", "evicted", "evicted_unauthenticated", "evicted_unauthenticated_per_peer"} {
				wantSample(t, s.reg, "meshca_connections_refused_total", map[string]string{"reason": r}, tt.reasons[r])
			}
		})
	}
}
