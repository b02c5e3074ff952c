package e2e

import (
	"net"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// cooldownChecks (issue 28, the 5-minute soak from 16 addresses): an
// address whose unauthenticated connections meshca keeps closing is
// refused at accept for a while (--max-unauthenticated-cooldown), so a
// flood's re-dials cost no TLS handshake; its neighbours are not, and an
// address a request authenticated from is never cooled. Against a
// meshca of its own whose handshake deadline is 300 ms, so that silent
// connections are closed within the row.
func cooldownChecks(t *testing.T) []check {
	m := newMesh(t, "--tls-handshake-timeout=300ms", "--max-unauthenticated-cooldown=1s")
	u := &arena{mesh: m, roots: m.s.roots}
	w := cluster.NewWorkload(t, u.apps, "cooled", "node-a")
	u.secret(w.Token)
	reason := func(r string) float64 { return u.metric(t, "meshca_connections_refused_total", "reason", r) }
	// closings has n silent connections from the address closed for
	// their handshake, waiting until meshca has counted them.
	closings := func(t *testing.T, from string, n int) {
		t.Helper()
		before := reason("handshake_timeout")
		for range n {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
			c, err := d.Dial("tcp", u.s.Addr)
			if err != nil {
				t.Fatalf("silent connection from %s: %v", from, err)
			}
			defer c.Close()
		}
		u.awaitMetric(t, "meshca_connections_refused_total", "reason", "handshake_timeout", before+float64(n))
	}
	send := func(w *harness.Workload, from string) error { return u.sendWithin(u.own(t, w, from)) }
	return []check{
		{name: "connections/an address whose unauthenticated connections keep being closed", defence: "conn:unauthenticated_cooldown", run: func(t *testing.T) {
			const flood, neighbour, known = "127.0.6.70", "127.0.6.71", "127.0.6.72"
			cooled := reason("cooling_down")
			closings(t, flood, 8)
			// Refused at accept, a client with a token too, until the
			// cool-down ends; another address is not held up.
			if err := send(w, flood); status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded {
				t.Errorf("a client from the cooled address: %v, want none (Unavailable or no answer)", err)
			}
			if now := reason("cooling_down"); now <= cooled {
				t.Errorf("meshca_connections_refused_total{reason=cooling_down} %v, want more than %v", now, cooled)
			}
			if err := send(w, neighbour); err != nil {
				t.Errorf("a client from another address: %v, want served", err)
			}
			time.Sleep(time.Second)
			if err := send(w, flood); err != nil {
				t.Errorf("a client from the address once its cool-down is over: %v, want served", err)
			}
			// An address a request authenticated from is not cooled.
			if err := send(w, known); err != nil {
				t.Fatalf("a client from a fresh address: %v, want served", err)
			}
			closings(t, known, 16)
			if err := send(w, known); err != nil {
				t.Errorf("a client from an address that authenticated, after 16 closings: %v, want served", err)
			}
		}},
	}
}
