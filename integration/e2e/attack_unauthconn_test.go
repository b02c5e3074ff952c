package e2e

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// unauthConnChecks (issue 28, the soak from 16 addresses): connections
// that have not authenticated have a budget of their own, far below
// --max-connections, against a meshca of their own whose budget is 8 in
// all and 4 an address. Past the address's cap a connection is refused
// at accept, before TLS; past the total, a newcomer from an address
// holding at least two fewer than the heaviest closes that address's
// oldest, others are refused. An authenticated connection is never
// closed for it.
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
	// never start TLS; closing them waits until meshca holds none.
	silent := func(t *testing.T, n int, from ...string) (closeAll func()) {
		var held []net.Conn
		closeAll = func() {
			for _, c := range held {
				c.Close()
			}
			held = nil
			u.awaitMetric(t, "meshca_connections_unauthenticated", "", "", 0)
		}
		t.Cleanup(closeAll)
		for _, ip := range from {
			for range n {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
				if c, err := d.Dial("tcp", u.s.Addr); err == nil {
					held = append(held, c)
				}
			}
		}
		return closeAll
	}
	within := func(t *testing.T, p probe, what string) {
		t.Helper()
		if err := u.sendWithin(p); err != nil {
			t.Fatalf("%s: %v, want served at once", what, err)
		}
	}
	reason := func(r string) float64 { return u.metric(t, "meshca_connections_refused_total", "reason", r) }
	return []check{
		{name: "connections/silent TCP from many addresses past --max-unauthenticated-connections", defence: "conn:unauthenticated_evicted", run: func(t *testing.T) {
			conn := u.connFrom(t, "127.0.6.1")
			within(t, probe{conn: conn, token: kept.Token, req: u.own(t, kept, "").req}, "the first request of a client that keeps its connection")
			u.awaitMetric(t, "meshca_connections_unauthenticated", "", "", 0)
			evicted, refused := reason("evicted_unauthenticated"), reason("unauthenticated_total")
			// 4 silent connections from each of 4 addresses: the first two
			// fill the 8; the others close the oldest of an address holding
			// two more than theirs, until all hold 2; the rest are refused.
			silent(t, 4, "127.0.6.16", "127.0.6.17", "127.0.6.18", "127.0.6.19")
			u.awaitMetric(t, "meshca_connections_refused_total", "reason", "evicted_unauthenticated", evicted+4)
			u.awaitMetric(t, "meshca_connections_refused_total", "reason", "unauthenticated_total", refused+4)
			u.awaitMetric(t, "meshca_connections_unauthenticated", "", "", 8)
			u.awaitMetric(t, "meshca_connections_open", "", "", 9)
			// A client from a fresh address closes one more, and is served.
			within(t, u.own(t, fresh, "127.0.6.2"), "a client from a fresh address with the budget full of silent connections")
			u.awaitMetric(t, "meshca_connections_refused_total", "reason", "evicted_unauthenticated", evicted+5)
			// The authenticated connection was kept through it all, and
			// serves: 7 silent ones and it are open.
			u.awaitMetric(t, "meshca_connections_open", "", "", 8)
			u.awaitMetric(t, "meshca_connections_unauthenticated", "", "", 7)
			within(t, probe{conn: conn, token: kept.Token, req: u.own(t, kept, "").req}, "a second request on the authenticated connection")
		}},
		{name: "connections/one address past --max-unauthenticated-connections-per-peer", defence: "conn:unauthenticated_per_peer_cap", run: func(t *testing.T) {
			before := reason("unauthenticated_per_peer")
			closeSilent := silent(t, 6, "127.0.6.40")
			u.awaitMetric(t, "meshca_connections_refused_total", "reason", "unauthenticated_per_peer", before+2)
			u.awaitMetric(t, "meshca_connections_unauthenticated", "", "", 4)
			// The address's next connection is refused at accept, before
			// TLS, a client's with a token too; another address is not
			// held up, and the address is served once its silent
			// connections are gone.
			if err := u.sendWithin(u.own(t, neighbour, "127.0.6.40")); status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded {
				t.Errorf("a fifth connection from the address: %v, want none (Unavailable or no answer)", err)
			}
			if now := reason("unauthenticated_per_peer"); now < before+3 {
				t.Errorf("meshca_connections_refused_total{reason=unauthenticated_per_peer} %v, want at least %v", now, before+3)
			}
			within(t, u.own(t, neighbour, "127.0.6.41"), "a client from another address")
			closeSilent()
			within(t, u.own(t, neighbour, "127.0.6.40"), "a client from the address once its silent connections are gone")
		}},
	}
}

// sendWithin makes p with a 2 s deadline: connection checks expect an
// answer at once, or none at all.
func (a *arena) sendWithin(p probe) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := a.send(ctx, p)
	return err
}
