package limit

import (
	"net/netip"
	"testing"
	"time"
)

// TestConnGuardCooldown: an address whose unauthenticated connections
// the guard keeps closing has its next ones refused at accept
// (cooling_down), for a time that doubles while it goes on; another
// address is not touched; an authentication from the address ends its
// cool-down and keeps it from the next; with the limit off nothing is
// cooled. Before it, a flood's every re-dial became a TLS handshake, an
// HTTP/2 connection and streams to refuse, and the 5-minute soak from 16
// addresses missed its latency target (issue 28).
func TestConnGuardCooldown(t *testing.T) {
	const a, b = "127.0.0.1", "127.0.0.2"
	const cooldown = 300 * time.Millisecond
	limits := func(max time.Duration) ConnLimits {
		return ConnLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: NoLimit,
			MaxUnauthenticatedConnections: NoLimit, MaxUnauthenticatedConnectionsPerPeer: NoLimit,
			TLSHandshakeTimeout: 20 * time.Millisecond, MaxUnauthenticatedCooldown: max}
	}
	// strikes has n connections from peer closed for their handshake.
	strikes := func(t *testing.T, s *guarded, peer string, n int) {
		t.Helper()
		timeouts := map[string]string{"reason": "handshake_timeout"}
		before, _ := sample(t, s.reg, "meshca_connections_refused_total", timeouts)
		for range n {
			c, ok := s.dialFrom(t, peer)
			if !ok {
				t.Fatalf("a connection from %s was refused before its address's %dth closing", peer, cooldownStrikes)
			}
			defer c.Close()
		}
		// Counted once struck (expire).
		waitSample(t, s.reg, "meshca_connections_refused_total", timeouts, before+float64(n))
	}
	admitted := func(t *testing.T, s *guarded, peer string, want bool) {
		t.Helper()
		c, ok := s.dialFrom(t, peer)
		if ok != want {
			t.Fatalf("a connection from %s: admitted %v, want %v", peer, ok, want)
		}
		if ok {
			c.Close()
		}
	}

	t.Run("cooled, then let back in", func(t *testing.T) {
		s := listenGuarded(t, limits(cooldown))
		strikes(t, s, a, cooldownStrikes-1)
		admitted(t, s, a, true) // one closing short: not cooled
		strikes(t, s, a, 1)
		admitted(t, s, a, false)
		admitted(t, s, b, true)
		wantSample(t, s.reg, "meshca_connections_refused_total", map[string]string{"reason": "cooling_down"}, 1)
		time.Sleep(cooldown) // cooldownFirst > cooldown: the first lasts the limit
		admitted(t, s, a, true)
	})
	t.Run("an authentication ends it and keeps the next away", func(t *testing.T) {
		s := listenGuarded(t, limits(time.Hour))
		held, _ := s.dialFrom(t, a)
		ctx := served(held.(*guardedConn).g, held) // serving: its handshake deadline is past
		strikes(t, s, a, cooldownStrikes)
		admitted(t, s, a, false)
		ConnAuthenticated(ctx)
		admitted(t, s, a, true)
		strikes(t, s, a, 2*cooldownStrikes)
		admitted(t, s, a, true)
	})
	t.Run("off", func(t *testing.T) {
		s := listenGuarded(t, limits(NoLimit))
		strikes(t, s, a, 2*cooldownStrikes)
		admitted(t, s, a, true)
		wantSample(t, s.reg, "meshca_connections_refused_total", map[string]string{"reason": "cooling_down"}, 0)
	})
}

// TestCoolingsDouble: each cool-down while the closings go on is twice
// the last, up to the limit; a quiet address starts over.
func TestCoolingsDouble(t *testing.T) {
	g := NewConnGuard(ConnGuardConfig{Limits: ConnLimits{MaxUnauthenticatedCooldown: 5 * time.Second}})
	peer := netip.MustParseAddr("192.0.2.1")
	var got []time.Duration
	for range 5 {
		for range cooldownStrikes {
			g.strike(peer)
		}
		c := g.cool.m[peer]
		got = append(got, time.Until(c.until).Round(time.Second))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("cool-downs %v, want %v", got, want)
		}
	}
	g.cool.m[peer].last = time.Now().Add(-g.cool.forget() - time.Second)
	for range cooldownStrikes {
		g.strike(peer)
	}
	if d := time.Until(g.cool.m[peer].until).Round(time.Second); d != time.Second {
		t.Fatalf("after a quiet spell the cool-down is %v, want 1s", d)
	}
}
