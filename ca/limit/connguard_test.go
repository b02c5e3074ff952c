package limit

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/metricstest"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"
)

// guarded is a ConnGuard's listener on 127.0.0.1 whose accepted
// connections arrive on accepted.
type guarded struct {
	addr     string
	reg      *prometheus.Registry
	accepted chan net.Conn

	mu    sync.Mutex
	conns []net.Conn // admitted, in order
}

// held returns the connections admitted so far.
func (s *guarded) held(*testing.T) []net.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.conns)
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
		s.mu.Lock()
		s.conns = append(s.conns, sc)
		s.mu.Unlock()
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

// TestConnGuardCaps: a connection past the per-address cap is closed as
// soon as it is accepted and counted, another address keeps its own cap;
// past the total, the newcomer is refused only when its own address
// holds the most; the defaults cap one address at 256 (its connections
// not yet authenticated at 64: TestConnGuardUnauthenticatedBudget).
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
		reasons  map[string]float64
		wantOpen int
	}{
		{name: "per address", lim: ConnLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: 3},
			from: []string{a, a, a, a, b, b, b, b, a}, refused: []int{3, 7, 8}, reasons: map[string]float64{"per_peer": 3}, wantOpen: 6},
		{name: "total, the newcomer's address holding the most", lim: ConnLimits{MaxConnections: 3, MaxConnectionsPerPeer: NoLimit},
			from: []string{a, a, b, a, a}, refused: []int{3, 4}, reasons: map[string]float64{"total": 2}, wantOpen: 3},
		{name: "total, ties refused", lim: ConnLimits{MaxConnections: 4, MaxConnectionsPerPeer: NoLimit},
			from: []string{a, a, a, b, b, a}, refused: []int{5}, reasons: map[string]float64{"evicted": 1, "total": 1}, wantOpen: 4},
		{name: "per address before total", lim: ConnLimits{MaxConnections: 2, MaxConnectionsPerPeer: 2},
			from: []string{a, a, a}, refused: []int{2}, reasons: map[string]float64{"per_peer": 1}, wantOpen: 2},
		{name: "default per address", lim: ConnLimits{MaxUnauthenticatedConnections: NoLimit, MaxUnauthenticatedConnectionsPerPeer: NoLimit}, from: many(a, DefaultMaxConnectionsPerPeer+1),
			refused: []int{DefaultMaxConnectionsPerPeer}, reasons: map[string]float64{"per_peer": 1}, wantOpen: DefaultMaxConnectionsPerPeer},
		{name: "no limits", lim: ConnLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: NoLimit, MaxUnauthenticatedConnections: NoLimit, MaxUnauthenticatedConnectionsPerPeer: NoLimit},
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
			for _, r := range []string{"total", "per_peer", "evicted", "handshake_timeout", "unauthenticated_idle", "unauthenticated_age", "streams_refused"} {
				wantSample(t, s.reg, "meshca_connections_refused_total", map[string]string{"reason": r}, tt.reasons[r])
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
	c3.Close()
	c4.Close()
	wantSample(t, s.reg, "meshca_connections_open", nil, 1)
	s.dialFrom(t, "127.0.0.3")
	s.dialFrom(t, "127.0.0.3")
	if _, ok := s.dialFrom(t, "127.0.0.3"); ok {
		t.Fatal("a connection was admitted past the total cap of 3 and its address's cap of 2")
	}
	wantSample(t, s.reg, "meshca_connections_refused_total", map[string]string{"reason": "per_peer"}, 2)
	wantSample(t, s.reg, "meshca_connections_refused_total", map[string]string{"reason": "total"}, 0)
	wantSample(t, s.reg, "meshca_connections_open", nil, 3)
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

// served has grpc-go's part of serving c done by hand: TagConn, which
// moves it past its handshake; it returns the connection's context.
func served(g *ConnGuard, c net.Conn) context.Context {
	return g.TagConn(context.Background(), &stats.ConnTagInfo{LocalAddr: c.LocalAddr(), RemoteAddr: c.RemoteAddr()})
}

func closed(c net.Conn) bool { return c.(*guardedConn).state.Load() == connClosed }

// TestConnGuardEvicts: a full server closes the oldest connection not
// yet authenticated, handshaking or serving, of the address holding the
// most, never an authenticated one; with nothing to close, the newcomer
// is refused.
func TestConnGuardEvicts(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := NewConnGuard(ConnGuardConfig{Limits: ConnLimits{MaxConnections: 5, MaxConnectionsPerPeer: NoLimit}, Registerer: reg})
	s := serveGuard(t, g, reg)
	var a []net.Conn
	for range 4 {
		c, _ := s.dialFrom(t, "127.0.0.1")
		a = append(a, c)
	}
	ConnAuthenticated(served(g, a[0])) // authenticated: never closed
	served(g, a[1])                    // serving, not authenticated
	b, _ := s.dialFrom(t, "127.0.0.2")
	// Full. 127.0.0.3 holds none: 127.0.0.1's oldest one not
	// authenticated makes room.
	if _, ok := s.dialFrom(t, "127.0.0.3"); !ok {
		t.Fatal("a newcomer from an address holding nothing was refused")
	}
	if !closed(a[1]) || closed(a[0]) || closed(a[2]) {
		t.Fatalf("closed: authenticated %v, serving %v, handshaking %v; want only the serving one (the oldest not authenticated)", closed(a[0]), closed(a[1]), closed(a[2]))
	}
	// 127.0.0.2 (1) makes 127.0.0.1 (3) give up its next oldest.
	if _, ok := s.dialFrom(t, "127.0.0.2"); !ok || !closed(a[2]) {
		t.Fatalf("a newcomer from an address holding fewer: admitted %v, the heaviest's handshaking one closed %v", ok, closed(a[2]))
	}
	// 127.0.0.1 and 127.0.0.2 hold 2 each: 127.0.0.2 is refused, a tie.
	if _, ok := s.dialFrom(t, "127.0.0.2"); ok {
		t.Fatal("a newcomer from an address holding as many as any was admitted")
	}
	wantSample(t, reg, "meshca_connections_refused_total", map[string]string{"reason": "evicted"}, 2)
	// Only authenticated connections left to 127.0.0.1 and 127.0.0.2:
	// nothing to close, even for a newcomer holding none.
	ConnAuthenticated(served(g, a[3]))
	ConnAuthenticated(served(g, b))
	for _, c := range s.held(t) {
		if !closed(c) {
			ConnAuthenticated(served(g, c))
		}
	}
	if _, ok := s.dialFrom(t, "127.0.0.4"); ok {
		t.Fatal("a connection was admitted with every slot held by authenticated ones")
	}
	wantSample(t, reg, "meshca_connections_refused_total", map[string]string{"reason": "total"}, 2)
	wantSample(t, reg, "meshca_connections_open", nil, 5)
}

// TestConnGuardUnauthenticatedAge: a connection on which no request has
// authenticated is closed MaxUnauthenticatedAge after its accept,
// whether still handshaking or serving with an RPC in progress; one on
// which a request authenticated stays.
func TestConnGuardUnauthenticatedAge(t *testing.T) {
	const age = 300 * time.Millisecond
	reg := prometheus.NewRegistry()
	g := NewConnGuard(ConnGuardConfig{Limits: ConnLimits{MaxUnauthenticatedAge: age, TLSHandshakeTimeout: NoLimit, MaxUnauthenticatedIdle: NoLimit}, Registerer: reg})
	s := serveGuard(t, g, reg)
	handshaking, _ := s.dialFrom(t, "127.0.0.1")
	busy, _ := s.dialFrom(t, "127.0.0.1")
	g.HandleRPC(served(g, busy), &stats.Begin{})
	authed, _ := s.dialFrom(t, "127.0.0.1")
	ConnAuthenticated(served(g, authed))
	start := time.Now()
	waitFor(t, func() bool { return closed(handshaking) && closed(busy) }, "the unauthenticated connections to close")
	if took := time.Since(start); took < age/2 {
		t.Fatalf("closed after %v, before the age of %v", took, age)
	}
	time.Sleep(age)
	if closed(authed) {
		t.Fatal("an authenticated connection was closed for its age")
	}
	wantSample(t, reg, "meshca_connections_refused_total", map[string]string{"reason": "unauthenticated_age"}, 2)
	wantSample(t, reg, "meshca_connections_open", nil, 1)
}
