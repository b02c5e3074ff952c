package serve

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/internal/metricstest"
	"github.com/prometheus/client_golang/prometheus"
)

// adminUnderTest is newAdmin's server on 127.0.0.1, serving /healthz and
// /big, an answer of bigAnswer bytes.
type adminUnderTest struct {
	addr string
	reg  *prometheus.Registry
}

const bigAnswer = 32 << 20

func serveAdmin(t *testing.T, lim limit.HTTPLimits) *adminUnderTest {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/big", func(w http.ResponseWriter, _ *http.Request) {
		chunk := make([]byte, 64<<10)
		for n := 0; n < bigAnswer; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, capped := newAdmin(lis, mux, lim, limit.NewHTTPConnMetrics(reg), slog.New(slog.DiscardHandler))
	served := make(chan struct{})
	go func() { _ = srv.Serve(capped); close(served) }()
	t.Cleanup(func() { srv.Close(); <-served })
	return &adminUnderTest{addr: lis.Addr().String(), reg: reg}
}

// dial connects from the source address from; a positive rcvbuf shrinks
// the client's receive buffer, as a client that reads slowly has it. It
// returns nil when the server reset the connection before connect
// returned.
func (a *adminUnderTest) dial(t *testing.T, from string, rcvbuf int) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, raw syscall.RawConn) error {
			return raw.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf) })
		}
	}
	c, err := d.Dial("tcp", a.addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends GET path on c, kept alive, and reads the answer; the body
// is read as far as the server sends it.
func get(t *testing.T, c net.Conn, br *bufio.Reader, path string, headers ...string) *http.Response {
	t.Helper()
	if c == nil {
		t.Fatalf("GET %s: the connection was refused", path)
	}
	req := "GET " + path + " HTTP/1.1\r\nHost: meshca\r\n" + strings.Join(append(headers, ""), "\r\n") + "\r\n"
	go func() { _, _ = io.WriteString(c, req) }()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	_, _ = io.Copy(io.Discard, r.Body)
	return r
}

// closedWithin reads c until the server closes it and fails t unless
// that comes between lo and hi after start.
func closedWithin(t *testing.T, c net.Conn, start time.Time, lo, hi time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(start.Add(hi + 2*time.Second))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	took := time.Since(start)
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("still open after %v, want closed within %v", took.Round(time.Millisecond), hi)
	case took < lo || took > hi:
		t.Fatalf("closed after %v (%v), want between %v and %v", took.Round(time.Millisecond), err, lo, hi)
	}
}

// refusedAtAccept fails t unless the server closes c at once, before
// any request (nil: before connect returned).
func refusedAtAccept(t *testing.T, c net.Conn) {
	t.Helper()
	if c == nil {
		return
	}
	closedWithin(t, c, time.Now(), 0, time.Second)
}

func (a *adminUnderTest) want(t *testing.T, name string, labels map[string]string, v float64) {
	t.Helper()
	labels["server"] = "admin"
	metricstest.Want(t, a.reg, name, labels, v)
}

// TestAdminServerLimits: the admin port, which anyone who reaches it may
// use without credentials, holds a connection no longer than its
// timeouts, a header list no larger than its bound, and no more
// connections than its caps.
func TestAdminServerLimits(t *testing.T) {
	short := limit.HTTPLimits{ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: 600 * time.Millisecond,
		WriteTimeout: 600 * time.Millisecond, IdleTimeout: 400 * time.Millisecond, MaxHeaderBytes: 4 << 10}
	caps := limit.HTTPLimits{MaxConnections: 3, MaxConnectionsPerPeer: 2}
	tests := []struct {
		name string
		lim  limit.HTTPLimits
		run  func(t *testing.T, a *adminUnderTest)
	}{
		{"a kept-alive connection is closed once idle", short, func(t *testing.T, a *adminUnderTest) {
			c := a.dial(t, "127.0.0.2", 0)
			if r := get(t, c, bufio.NewReader(c), "/healthz"); r.StatusCode != http.StatusOK || r.Close {
				t.Fatalf("%s, close %v: want 200 kept alive", r.Status, r.Close)
			}
			closedWithin(t, c, time.Now(), 300*time.Millisecond, 2*time.Second)
			a.want(t, "meshca_http_connections_open", map[string]string{}, 0)
		}},
		{"headers trickled are cut", short, func(t *testing.T, a *adminUnderTest) {
			c := a.dial(t, "127.0.0.2", 0)
			start := time.Now()
			go trickle(c, "GET /healthz HTTP/1.1\r\nHost: meshca\r\n", "X-Slow: 1\r\n")
			closedWithin(t, c, start, 200*time.Millisecond, 2*time.Second)
		}},
		{"a body trickled is cut", short, func(t *testing.T, a *adminUnderTest) {
			c := a.dial(t, "127.0.0.2", 0)
			start := time.Now()
			go trickle(c, "POST /healthz HTTP/1.1\r\nHost: meshca\r\nContent-Length: 100000\r\n\r\n", "x")
			closedWithin(t, c, start, 500*time.Millisecond, 3*time.Second)
		}},
		{"an answer read too slowly is cut", short, func(t *testing.T, a *adminUnderTest) {
			c := a.dial(t, "127.0.0.2", 4<<10)
			if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: meshca\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second) // reading nothing, past the write timeout
			a.want(t, "meshca_http_connections_open", map[string]string{}, 0)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, _ := io.Copy(io.Discard, c)
			if n >= bigAnswer {
				t.Fatalf("read the whole answer, %d bytes", n)
			}
		}},
		{"headers over the bound get 431", short, func(t *testing.T, a *adminUnderTest) {
			c := a.dial(t, "127.0.0.2", 0)
			r := get(t, c, bufio.NewReader(c), "/healthz", "X-Pad: "+strings.Repeat("a", 16<<10))
			if r.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
				t.Fatalf("%s, want 431", r.Status)
			}
		}},
		{"one address past its cap is refused, another served", caps, func(t *testing.T, a *adminUnderTest) {
			a.dial(t, "127.0.0.3", 0)
			a.dial(t, "127.0.0.3", 0)
			refusedAtAccept(t, a.dial(t, "127.0.0.3", 0))
			c := a.dial(t, "127.0.0.4", 0)
			if r := get(t, c, bufio.NewReader(c), "/healthz"); r.StatusCode != http.StatusOK {
				t.Fatalf("another address: %s", r.Status)
			}
			a.want(t, "meshca_http_connections_refused_total", map[string]string{"reason": "per_peer"}, 1)
		}},
		{"an address at its cap makes room by closing its idle connection", caps, func(t *testing.T, a *adminUnderTest) {
			// A client that opens a connection for each request and
			// leaves it open (go-spiffe's federation.FetchBundle).
			for i := range 5 {
				c := a.dial(t, "127.0.0.10", 0)
				if r := get(t, c, bufio.NewReader(c), "/healthz"); r.StatusCode != http.StatusOK {
					t.Fatalf("request %d: %s", i, r.Status)
				}
				settle()
			}
			a.want(t, "meshca_http_connections_refused_total", map[string]string{"reason": "evicted"}, 3)
			a.want(t, "meshca_http_connections_open", map[string]string{}, 2)
		}},
		{"at the total cap the address holding most makes room, then an idle one", caps, func(t *testing.T, a *adminUnderTest) {
			held := []net.Conn{a.dial(t, "127.0.0.5", 0), a.dial(t, "127.0.0.5", 0)}
			a.dial(t, "127.0.0.6", 0)
			c := a.dial(t, "127.0.0.7", 0) // 127.0.0.5's oldest goes
			if r := get(t, c, bufio.NewReader(c), "/healthz"); r.StatusCode != http.StatusOK {
				t.Fatalf("a new address at the total cap: %s", r.Status)
			}
			refusedAtAccept(t, held[0])
			settle()
			// Every address holds one: 127.0.0.7's, idle, goes.
			a.dial(t, "127.0.0.8", 0)
			refusedAtAccept(t, c)
			refusedAtAccept(t, a.dial(t, "127.0.0.9", 0)) // none idle
			a.want(t, "meshca_http_connections_refused_total", map[string]string{"reason": "evicted"}, 2)
			a.want(t, "meshca_http_connections_refused_total", map[string]string{"reason": "total"}, 1)
			a.want(t, "meshca_http_connections_open", map[string]string{}, 3)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, serveAdmin(t, tt.lim)) })
	}
}

// settle gives net/http the moment it takes, after an answer the client
// has read, to mark its connection idle.
func settle() { time.Sleep(100 * time.Millisecond) }

// trickle writes head, then more every 100 ms until the connection fails.
func trickle(c net.Conn, head, more string) {
	if _, err := io.WriteString(c, head); err != nil {
		return
	}
	for {
		time.Sleep(100 * time.Millisecond)
		if _, err := fmt.Fprint(c, more); err != nil {
			return
		}
	}
}
