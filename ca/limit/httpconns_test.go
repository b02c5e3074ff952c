package limit

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/metricstest"
	"github.com/prometheus/client_golang/prometheus"
)

// capped is an HTTPConns' listener on 127.0.0.1 whose admitted
// connections arrive on accepted.
type capped struct {
	h        *HTTPConns
	addr     string
	reg      *prometheus.Registry
	accepted chan net.Conn
}

func listenCapped(t *testing.T, lim HTTPLimits) *capped {
	t.Helper()
	reg := prometheus.NewRegistry()
	h := NewHTTPConns(HTTPConnsConfig{Server: "admin", Limits: lim, Metrics: NewHTTPConnMetrics(reg)})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := h.Attach(&http.Server{}, lis)
	s := &capped{h: h, addr: lis.Addr().String(), reg: reg, accepted: make(chan net.Conn, 64)}
	go func() {
		for {
			c, err := cl.Accept()
			if err != nil {
				close(s.accepted)
				return
			}
			s.accepted <- c
		}
	}()
	t.Cleanup(func() {
		cl.Close()
		for c := range s.accepted {
			c.Close()
		}
	})
	return s
}

// dial connects from the source address from and reports whether the
// caps admitted the connection (it arrived from Accept) or closed it. It
// returns the client's end and, when admitted, the server's.
func (s *capped) dial(t *testing.T, from string) (client, server net.Conn, admitted bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", s.addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil, nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	select {
	case sc := <-s.accepted:
		if sc.RemoteAddr().String() != c.LocalAddr().String() {
			t.Fatalf("accepted %v, dialled from %v", sc.RemoteAddr(), c.LocalAddr())
		}
		t.Cleanup(func() { sc.Close() })
		return c, sc, true
	case <-time.After(time.Second):
	}
	if !closedByServer(c, 2*time.Second) {
		t.Fatal("the connection was neither accepted nor closed")
	}
	return c, nil, false
}

// closedByServer says whether the server closed c within d.
func closedByServer(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, net.ErrClosed) && !isTimeout(err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestHTTPConnsCaps: past its address's cap a connection is closed at
// accept; at the total cap a new address takes the place of the oldest
// connection of the address holding the most, until every address holds
// one and the next is closed. Each closing is counted by reason.
func TestHTTPConnsCaps(t *testing.T) {
	s := listenCapped(t, HTTPLimits{MaxConnections: 4, MaxConnectionsPerPeer: 3})
	type step struct {
		from  string
		admit bool
		// evicts is the index, in the order dialled, of the connection
		// closed to make room; -1 for none.
		evicts int
	}
	steps := []step{
		{"127.0.0.2", true, -1}, // 0
		{"127.0.0.2", true, -1}, // 1
		{"127.0.0.2", true, -1}, // 2
		{"127.0.0.2", false, -1},
		{"127.0.0.3", true, -1}, // 4: the total is reached
		{"127.0.0.4", true, 0},  // 127.0.0.2 holds 3: its oldest goes
		{"127.0.0.5", true, 1},  // it still holds 2
		{"127.0.0.5", false, -1},
		{"127.0.0.6", false, -1}, // every address holds one
	}
	var conns []net.Conn
	for i, st := range steps {
		c, _, ok := s.dial(t, st.from)
		if ok != st.admit {
			t.Fatalf("step %d from %s: admitted %v, want %v", i, st.from, ok, st.admit)
		}
		conns = append(conns, c)
		if st.evicts >= 0 && !closedByServer(conns[st.evicts], 2*time.Second) {
			t.Fatalf("step %d: connection %d was not closed to make room", i, st.evicts)
		}
	}
	for reason, want := range map[string]float64{"per_peer": 1, "total": 2, "evicted": 2} {
		metricstest.Want(t, s.reg, "meshca_http_connections_refused_total", map[string]string{"server": "admin", "reason": reason}, want)
	}
	metricstest.Want(t, s.reg, "meshca_http_connections_open", map[string]string{"server": "admin"}, 4)
}

// TestHTTPConnsIdleMakesRoom: at its address's cap a new connection
// takes the place of the address's oldest idle one (net/http keeps it
// alive between requests); with none idle it is refused.
func TestHTTPConnsIdleMakesRoom(t *testing.T) {
	s := listenCapped(t, HTTPLimits{MaxConnectionsPerPeer: 2})
	c0, s0, _ := s.dial(t, "127.0.0.2")
	_, s1, _ := s.dial(t, "127.0.0.2")
	s.h.connState(s1, http.StateActive)
	s.h.connState(tls.Server(s0, &tls.Config{}), http.StateIdle) // as a TLS server names it
	if _, _, ok := s.dial(t, "127.0.0.2"); !ok {
		t.Fatal("refused with an idle connection of its address to close")
	}
	if !closedByServer(c0, 2*time.Second) {
		t.Fatal("the idle connection was kept")
	}
	if _, _, ok := s.dial(t, "127.0.0.2"); ok {
		t.Fatal("admitted past the cap with none idle")
	}
	metricstest.Want(t, s.reg, "meshca_http_connections_refused_total", map[string]string{"server": "admin", "reason": "evicted"}, 1)
	metricstest.Want(t, s.reg, "meshca_http_connections_refused_total", map[string]string{"server": "admin", "reason": "per_peer"}, 1)
}

// TestHTTPConnsIdleMakesRoomAtTotal: at the total cap, every address
// holding one, a new connection takes the place of the oldest idle one of
// any address; with none idle it is refused.
func TestHTTPConnsIdleMakesRoomAtTotal(t *testing.T) {
	s := listenCapped(t, HTTPLimits{MaxConnections: 3})
	_, s0, _ := s.dial(t, "127.0.0.2")
	c1, s1, _ := s.dial(t, "127.0.0.3")
	c2, s2, _ := s.dial(t, "127.0.0.4")
	s.h.connState(s0, http.StateActive)
	s.h.connState(s2, http.StateIdle)
	s.h.connState(s1, http.StateIdle)
	if _, _, ok := s.dial(t, "127.0.0.5"); !ok {
		t.Fatal("refused with idle connections to close")
	}
	if !closedByServer(c1, 2*time.Second) {
		t.Fatal("the oldest idle connection was kept")
	}
	if _, _, ok := s.dial(t, "127.0.0.6"); !ok || !closedByServer(c2, 2*time.Second) {
		t.Fatal("the next idle connection did not make room")
	}
	if _, _, ok := s.dial(t, "127.0.0.7"); ok {
		t.Fatal("admitted past the total with none idle")
	}
	metricstest.Want(t, s.reg, "meshca_http_connections_refused_total", map[string]string{"server": "admin", "reason": "evicted"}, 2)
	metricstest.Want(t, s.reg, "meshca_http_connections_refused_total", map[string]string{"server": "admin", "reason": "total"}, 1)
}

// TestHTTPConnsReleases: a closed connection gives its place back, to its
// address and to the total; the defaults cap one address at 16 and all
// at 128; NoLimit turns a cap off.
func TestHTTPConnsReleases(t *testing.T) {
	s := listenCapped(t, HTTPLimits{MaxConnections: NoLimit, MaxConnectionsPerPeer: 1})
	_, first, ok := s.dial(t, "127.0.0.2")
	if !ok {
		t.Fatal("first connection refused")
	}
	if _, _, ok := s.dial(t, "127.0.0.2"); ok {
		t.Fatal("second connection admitted past a cap of 1")
	}
	first.Close() // as net/http does once its client has gone
	metricstest.Want(t, s.reg, "meshca_http_connections_open", map[string]string{"server": "admin"}, 0)
	if _, _, ok := s.dial(t, "127.0.0.2"); !ok {
		t.Fatal("refused after its address's connection closed")
	}
	def := HTTPLimits{}.WithDefaults()
	if def.MaxConnections != 128 || def.MaxConnectionsPerPeer != 16 {
		t.Errorf("defaults %d total, %d a peer; want 128, 16", def.MaxConnections, def.MaxConnectionsPerPeer)
	}
}

// TestHTTPConnsLogsRarely: a flood of refusals is one debug line a second,
// naming the server, with the number left unlogged.
func TestHTTPConnsLogsRarely(t *testing.T) {
	var buf lockedLog
	h := NewHTTPConns(HTTPConnsConfig{Server: "admin", Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	for range 50 {
		h.refuse(httpRefusedPerPeer, netip.MustParseAddr("127.0.0.2"))
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 || !strings.Contains(buf.String(), `"server":"admin"`) {
		t.Fatalf("%d lines: %s", n, buf.String())
	}
}

// TestHTTPLimitsServer: the server takes every limit, the defaults for
// zero fields.
func TestHTTPLimitsServer(t *testing.T) {
	got := HTTPLimits{IdleTimeout: time.Second}.Server(http.NotFoundHandler())
	want := []time.Duration{5 * time.Second, 10 * time.Second, 30 * time.Second, time.Second}
	for i, d := range []time.Duration{got.ReadHeaderTimeout, got.ReadTimeout, got.WriteTimeout, got.IdleTimeout} {
		if d != want[i] {
			t.Errorf("timeouts %v, %v, %v, %v; want %v", got.ReadHeaderTimeout, got.ReadTimeout, got.WriteTimeout, got.IdleTimeout, want)
			break
		}
	}
	if got.MaxHeaderBytes != 8<<10 || got.Handler == nil {
		t.Errorf("MaxHeaderBytes %d, handler %v", got.MaxHeaderBytes, got.Handler)
	}
}

// lockedLog is a log's buffer written from several goroutines.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
