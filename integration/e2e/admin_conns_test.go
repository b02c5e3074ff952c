package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
)

// adminMaxConns is --admin-max-connections' default
// (limit.DefaultHTTPMaxConnections).
const adminMaxConns = 128

// TestAdminKeepAlives (issue 28, item 5): 3,000 clients from 30
// addresses each ask the admin port for /healthz and keep their
// connection open, as a client that never closes would. Every one is
// answered; meshca holds at most --admin-max-connections of the
// connections at once (a new one takes the place of an idle one), and
// none once they have been idle for 10 s. Before, it held every one for
// ever, ~20 KiB each, and 13,000 reached the chart's memory limit.
// MESHCA_BIN=<older build> measures the same against it.
func TestAdminKeepAlives(t *testing.T) {
	const clients, addrs, dialers = 3000, 30, 16
	raiseNoFile(t, 2*clients+1024)
	s := startServer(t)
	rssBefore := procStatus(t, s.Pid(), "VmRSS")
	var (
		mu       sync.Mutex
		conns    []net.Conn
		answered atomic.Int64
		next     atomic.Int64
		wg       sync.WaitGroup
		start    = time.Now()
	)
	t.Cleanup(func() { closeAll(conns) })
	for range dialers {
		wg.Go(func() {
			for i := int(next.Add(1)); i <= clients; i = int(next.Add(1)) {
				c, ok := keepAliveGet(s.AdminAddr, fmt.Sprintf("127.0.10.%d", 1+i%addrs))
				if ok {
					answered.Add(1)
				}
				if c != nil {
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	time.Sleep(time.Second) // the evicted connections' resets arrive
	held := stillOpen(conns)
	rssHeld, hwm := procStatus(t, s.Pid(), "VmRSS"), procStatus(t, s.Pid(), "VmHWM")
	e := scrapeMetrics(t, s.AdminAddr)
	open := sampleValue(e, "meshca_http_connections_open", "server", "admin")
	evicted := sampleValue(e, "meshca_http_connections_refused_total", "reason", "evicted")
	time.Sleep(idleTimeout + 2*time.Second)
	heldIdle := stillOpen(conns)
	rssIdle := procStatus(t, s.Pid(), "VmRSS")
	harness.Report(t, "%d admin keep-alives from %d addresses in %v: %d answered; meshca held %d (meshca_http_connections_open %.0f, evicted %.0f), "+
		"%d after %v idle; VmRSS %d MiB before, %d MiB holding them (peak %d MiB), %d MiB after the idle timeout",
		clients, addrs, took.Round(time.Millisecond), answered.Load(), held, open, evicted, heldIdle, idleTimeout+2*time.Second,
		rssBefore>>20, rssHeld>>20, hwm>>20, rssIdle>>20)
	switch {
	case answered.Load() != clients:
		t.Errorf("%d of %d requests answered, want all: a client's new connection takes the place of an idle one", answered.Load(), clients)
	case held > adminMaxConns:
		t.Errorf("meshca held %d connections, over --admin-max-connections %d", held, adminMaxConns)
	case heldIdle != 0:
		t.Errorf("%d connections still open %v after their answer, past the idle timeout", heldIdle, idleTimeout+2*time.Second)
	}
}

// keepAliveGet asks for /healthz from the address from and keeps the
// connection; ok says whether it was answered 200. c is nil when the
// connection failed.
func keepAliveGet(addr, from string) (c net.Conn, ok bool) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, false
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: meshca\r\n\r\n"); err != nil {
		return c, false
	}
	r, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return c, false
	}
	_, _ = io.Copy(io.Discard, r.Body)
	_ = c.SetDeadline(time.Time{})
	return c, r.StatusCode == http.StatusOK
}

// stillOpen counts the connections the server has not closed: a read
// waits, rather than ending.
func stillOpen(conns []net.Conn) int {
	var n atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			_, err := c.Read(make([]byte, 1))
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return int(n.Load())
}
