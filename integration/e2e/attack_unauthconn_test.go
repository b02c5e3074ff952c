package e2e

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
)

// unauthConnChecks (issue 28, the soak from 16 addresses): connections
// that have not authenticated have a budget of their own, far below
// --max-connections, against a meshca of their own whose budget is 8 in
// all and 4 an address. Past it a newcomer is admitted and the oldest
// such connection of its address, or of the address holding the most,
// closed; an authenticated connection is never closed for it, and a
// client with a token is never turned away.
func unauthConnChecks(t *testing.T) []check {
	m := newMesh(t, "--max-unauthenticated-connections=8", "--max-unauthenticated-connections-per-peer=4")
	u := &arena{mesh: m, roots: m.s.roots}
	workload := func(name string) *harness.Workload {
		w := cluster.NewWorkload(t, u.apps, name, "node-a")
		u.secret(w.Token)
		return w
	}
	kept, fresh, neighbour := workload("kept"), workload("fresh"), workload("neighbour")
	// silent opens n TCP connections from each of the addresses, which
	// never start TLS, closed when the row ends.
	silent := func(t *testing.T, n int, from ...string) {
		var held []net.Conn
		t.Cleanup(func() {
			closeAll(held)
			u.awaitMetric(t, "meshca_connections_unauthenticated", "", "", 0)
		})
		for _, ip := range from {
			for range n {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
				if c, err := d.Dial("tcp", u.s.Addr); err == nil {
					held = append(held, c)
				}
			}
		}
	}
	within := func(t *testing.T, w *harness.Workload, p probe, what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := u.send(ctx, p); err != nil {
			t.Fatalf("%s: %v, want served at once", what, err)
		}
	}
	return []check{
		{name: "connections/silent TCP from 16 addresses past --max-unauthenticated-connections", defence: "conn:unauthenticated_evicted", run: func(t *testing.T) {
			conn := u.connFrom(t, "127.0.6.1")
			within(t, kept, probe{conn: conn, req: u.own(t, kept, "").req, token: kept.Token}, "the first request of a client that keeps its connection")
			u.awaitMetric(t, "meshca_connections_unauthenticated", "", "", 0)
			evicted := u.metric(t, "meshca_connections_refused_total", "reason", "evicted_unauthenticated")
			var from []string
			for i := range 16 {
				from = append(from, fmt.Sprintf("127.0.6.%d", 16+i))
			}
			silent(t, 2, from...)
			// 32 silent connections, each address under its cap of 4: 8
			// held, the oldest of the heaviest closed for each newer one.
			u.awaitMetric(t, "meshca_connections_refused_total", "reason", "evicted_unauthenticated", evicted+24)
			u.awaitMetric(t, "meshca_connections_unauthenticated", "", "", 8)
			u.awaitMetric(t, "meshca_connections_open", "", "", 9)
			// A newcomer from a fresh address closes one more, and leaves.
			within(t, fresh, u.own(t, fresh, "127.0.6.2"), "a client from a fresh address with the budget full of silent connections")
			u.awaitMetric(t, "meshca_connections_refused_total", "reason", "evicted_unauthenticated", evicted+25)
			// The authenticated connection was kept through it all, and
			// serves: 7 silent ones and it are open.
			u.awaitMetric(t, "meshca_connections_open", "", "", 8)
			u.awaitMetric(t, "meshca_connections_unauthenticated", "", "", 7)
			within(t, kept, probe{conn: conn, req: u.own(t, kept, "").req, token: kept.Token}, "a second request on the authenticated connection")
		}},
		{name: "connections/one address past --max-unauthenticated-connections-per-peer", defence: "conn:unauthenticated_per_peer_evicted", run: func(t *testing.T) {
			before := u.metric(t, "meshca_connections_refused_total", "reason", "evicted_unauthenticated_per_peer")
			silent(t, 6, "127.0.6.40")
			u.awaitMetric(t, "meshca_connections_unauthenticated", "", "", 4)
			// A client at that address with a good token takes the place
			// of its oldest silent neighbour.
			within(t, neighbour, u.own(t, neighbour, "127.0.6.40"), "a client sharing the address of 4 silent connections")
			u.awaitMetric(t, "meshca_connections_refused_total", "reason", "evicted_unauthenticated_per_peer", before+3)
		}},
	}
}
