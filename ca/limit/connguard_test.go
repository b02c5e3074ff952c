package limit

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/metricstest"
	"github.com/prometheus/client_golang/prometheus"
)

// guarded is a ConnGuard's listener on 127.0.0.1 whose accepted
// connections arrive on accepted.
type guarded struct {
	addr     string
	reg      *prometheus.Registry
	accepted chan net.Conn
}

func listenGuarded(t *testing.T, lim ConnLimits) *guarded {
	t.Helper()
	reg := prometheus.NewRegistry()
	return serveGuard(t, NewConnGuard(ConnGuardConfig{Limits: lim, Registerer: reg}), reg)
}

func serveGuard(t *testing.T, g *ConnGuard, reg *prometheus.Registry) *guarded {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl := g.Listener(lis)
	s := &guarded{addr: lis.Addr().String(), reg: reg, accepted: make(chan net.Conn, 1024)}
	go func() {
		for {
			c, err := gl.Accept()
			if err != nil {
				close(s.accepted)
				return
			}
			s.accepted <- c
		}
	}()
	t.Cleanup(func() {
		gl.Close()
		for c := range s.accepted {
			c.Close()
		}
	})
	return s
}

// dialFrom connects from the source address from (127.0.0.2 is as local
// as 127.0.0.1 on Linux) and reports whether the guard admitted the
// connection: it arrived from Accept, or the server closed it.
func (s *guarded) dialFrom(t *testing.T, from string) (net.Conn, bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", s.addr)
	if errors.Is(err, syscall.ECONNRESET) {
		// Refused, and reset before connect returned.
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	closed := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		closed <- err
	}()
	select {
	case sc := <-s.accepted:
		if sc.RemoteAddr().String() != c.LocalAddr().String() {
			t.Fatalf("accepted %v, dialled from %v", sc.RemoteAddr(), c.LocalAddr())
		}
		t.Cleanup(func() { sc.Close() })
		return sc, true
	case err := <-closed:
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read %v from a connection the server should have closed", err)
		}
		return nil, false
	case <-time.After(5 * time.Second):
		t.Fatal("the connection was neither accepted nor closed within 5s")
	}
	return nil, false
}

// TestConnGuardCaps: a connection past the total or the per-address cap
// is closed as soon as it is accepted and counted; another address keeps
// its own per-address cap; the defaults cap one address at 256.
func TestConnGuardCaps(t *testing.T) {
	const a, b = "127.0.0.1", "127.0.0.2"
	many := func(from string, n int) []string {
		s := make([]string, n)
		for i := range s {
			s[i] = from
		}
		return s
	}
	tests := []struct {
		name     string
		lim      ConnLimits
		from     []string
		refused  []int // indexes into from
		reason   string
		wantOpen int
	}{
		{name: "per address", lim: ConnLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: 3},
			from: []string{a, a, a, a, b, b, b, b, a}, refused: []int{3, 7, 8}, reason: "per_peer", wantOpen: 6},
		{name: "total", lim: ConnLimits{MaxConnections: 3, MaxConnectionsPerPeer: NoLimit},
			from: []string{a, b, a, b, a}, refused: []int{3, 4}, reason: "total", wantOpen: 3},
		{name: "total before per address", lim: ConnLimits{MaxConnections: 2, MaxConnectionsPerPeer: 2},
			from: []string{a, a, a, b}, refused: []int{2, 3}, reason: "total", wantOpen: 2},
		{name: "default per address", from: many(a, DefaultMaxConnectionsPerPeer+1),
			refused: []int{DefaultMaxConnectionsPerPeer}, reason: "per_peer", wantOpen: DefaultMaxConnectionsPerPeer},
		{name: "no limits", lim: ConnLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: NoLimit},
			from: many(a, DefaultMaxConnectionsPerPeer+1), wantOpen: DefaultMaxConnectionsPerPeer + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := listenGuarded(t, tt.lim)
			refused := map[int]bool{}
			for _, i := range tt.refused {
				refused[i] = true
			}
			for i, from := range tt.from {
				if _, ok := s.dialFrom(t, from); ok == refused[i] {
					t.Fatalf("connection %d from %s: admitted %v, want %v", i, from, ok, !refused[i])
				}
			}
			wantSample(t, s.reg, "meshca_connections_open", nil, float64(tt.wantOpen))
			for _, r := range []string{"total", "per_peer", "handshake_timeout", "unauthenticated_idle"} {
				want := 0.0
				if r == tt.reason {
					want = float64(len(tt.refused))
				}
				wantSample(t, s.reg, "meshca_connections_refused_total", map[string]string{"reason": r}, want)
			}
		})
	}
}

// TestConnGuardReleasesOnClose: a closed connection gives its place back,
// once however often it is closed.
func TestConnGuardReleasesOnClose(t *testing.T) {
	s := listenGuarded(t, ConnLimits{MaxConnections: 3, MaxConnectionsPerPeer: 2})
	c1, _ := s.dialFrom(t, "127.0.0.1")
	c2, _ := s.dialFrom(t, "127.0.0.1")
	if _, ok := s.dialFrom(t, "127.0.0.1"); ok {
		t.Fatal("a third connection from one address was admitted past the cap of 2")
	}
	for range 3 {
		c1.Close()
	}
	wantSample(t, s.reg, "meshca_connections_open", nil, 1)
	if _, ok := s.dialFrom(t, "127.0.0.1"); !ok {
		t.Fatal("no connection admitted after one of two was closed")
	}
	c2.Close()
	c3, _ := s.dialFrom(t, "127.0.0.2")
	c4, _ := s.dialFrom(t, "127.0.0.2")
	if _, ok := s.dialFrom(t, "127.0.0.3"); ok {
		t.Fatal("a fourth connection was admitted past the total cap of 3")
	}
	c3.Close()
	c4.Close()
	wantSample(t, s.reg, "meshca_connections_open", nil, 1)
	wantSample(t, s.reg, "meshca_connections_refused_total", map[string]string{"reason": "per_peer"}, 1)
	wantSample(t, s.reg, "meshca_connections_refused_total", map[string]string{"reason": "total"}, 1)
}

// guardedFixture is the CA server behind a ConnGuard with lim.
func TestConnGuardLogsRarely(t *testing.T) {
	logs := &syncBuffer{}
	g := NewConnGuard(ConnGuardConfig{Limits: ConnLimits{MaxConnectionsPerPeer: 1},
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	s := serveGuard(t, g, nil)
	start := time.Now()
	s.dialFrom(t, "127.0.0.1")
	for range 20 {
		if _, ok := s.dialFrom(t, "127.0.0.1"); ok {
			t.Fatal("a connection past the cap of 1 was admitted")
		}
	}
	if time.Since(start) >= time.Second {
		t.Skip("the refusals took over a second: more than one line is right")
	}
	if n := strings.Count(logs.String(), `"msg":"connection refused"`); n != 1 {
		t.Fatalf("%d log lines for 20 refusals within a second, want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), `"reason":"per_peer","peer":"127.0.0.1","open_connections":1,"suppressed":0`) {
		t.Fatalf("the line lacks the reason, peer or counts:\n%s", logs)
	}
}

// sample and wantSample read the series a test looks for.
var sample, wantSample = metricstest.Sample, metricstest.Want

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
