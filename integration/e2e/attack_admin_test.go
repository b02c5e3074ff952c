package e2e

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// idleTimeout is the IdleTimeout of the admin port and of the bundle
// endpoint (limit.DefaultHTTPIdleTimeout): a connection kept alive after
// its answer is closed once it has sent nothing more for that long.
const idleTimeout = 10 * time.Second

// Issue 28, item 5: the caps of the budget arena's admin port.
var adminCapFlags = []string{"--admin-max-connections", "6", "--admin-max-connections-per-peer", "3"}

// keptAlive makes one request on a connection kept alive (TLS when
// tlsOn) and reports how long the server kept it open after the answer.
func keptAlive(addr string, tlsOn bool) slowResult {
	var c net.Conn
	var err error
	if tlsOn {
		c, err = tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
	} else {
		c, err = net.Dial("tcp", addr)
	}
	if err != nil {
		return slowResult{err: err}
	}
	defer c.Close()
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: meshca\r\n\r\n"); err != nil {
		return slowResult{err: err}
	}
	r, err := http.ReadResponse(br, nil)
	if err != nil {
		return slowResult{err: err}
	}
	_, _ = io.Copy(io.Discard, r.Body)
	if r.Close {
		return slowResult{err: errors.New("the server closed the connection with its answer: not kept alive")}
	}
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(3 * idleTimeout))
	b, err := io.ReadAll(br)
	return slowResult{took: time.Since(start), got: string(b), err: err}
}

// idleClosed judges a keptAlive result: closed about idleTimeout after
// its answer.
func idleClosed(name, defence string, c chan slowResult) check {
	return check{name: name, defence: defence, run: func(t *testing.T) {
		r := <-c
		var ne net.Error
		switch {
		case r.err != nil && errors.As(r.err, &ne) && ne.Timeout():
			t.Fatalf("the kept-alive connection was still open %v after its answer", r.took.Round(time.Millisecond))
		case r.took == 0 && r.err != nil:
			t.Fatal(r.err)
		case r.took < idleTimeout-time.Second || r.took > idleTimeout+3*time.Second:
			t.Errorf("closed %v after its answer, want about %v (IdleTimeout)", r.took.Round(time.Millisecond), idleTimeout)
		}
		t.Logf("closed %v after its answer (%v)", r.took.Round(time.Millisecond), r.err)
	}}
}

// adminConnChecks: connections to the budget arena's admin port past
// --admin-max-connections-per-peer (3) and --admin-max-connections (6),
// each held as a client that sends nothing would.
func (b *arena) adminConnChecks(t *testing.T) []check {
	addr := b.s.AdminAddr
	refused := func(t *testing.T, reason string) float64 {
		return sampleValue(scrapeMetrics(t, addr), "meshca_http_connections_refused_total", "reason", reason)
	}
	return []check{
		{name: "admin/one address past its connections", defence: "admin:per_peer_cap", run: func(t *testing.T) {
			before := refused(t, "per_peer")
			held := holdTCP(t, addr, "127.0.5.1", 3)
			if c := adminDial(t, addr, "127.0.5.1"); !closedAtAccept(c) {
				t.Error("a 4th connection from one address was kept")
			}
			if code := getFrom(t, addr, "127.0.5.2"); code != http.StatusOK {
				t.Errorf("another address meanwhile: %d", code)
			}
			closeAll(held)
			if now := refused(t, "per_peer"); now <= before {
				t.Errorf(`meshca_http_connections_refused_total{reason="per_peer"} stayed at %v`, now)
			}
		}},
		{name: "admin/new addresses at the total: the one holding most makes room", defence: "admin:total_cap_makes_room", run: func(t *testing.T) {
			before := refused(t, "evicted")
			held := holdTCP(t, addr, "127.0.6.1", 3)
			for i := range 4 {
				if code := getFrom(t, addr, fmt.Sprintf("127.0.6.%d", 2+i)); code != http.StatusOK {
					t.Fatalf("address %d of 4 at the cap: %d", i+1, code)
				}
			}
			if !closedAtAccept(held[0]) {
				t.Error("the oldest connection of the address holding the most was kept")
			}
			closeAll(held)
			if now := refused(t, "evicted"); now <= before {
				t.Errorf(`meshca_http_connections_refused_total{reason="evicted"} stayed at %v`, now)
			}
		}},
		{name: "admin/every address holding one, none idle: the next is refused", defence: "admin:total_cap", run: func(t *testing.T) {
			// Scrapes from 127.0.0.1 may hold a connection or two, idle:
			// the first addresses past the cap take their places.
			before := refused(t, "total")
			var held []net.Conn
			for i := range 8 {
				if c := adminDial(t, addr, fmt.Sprintf("127.0.7.%d", 1+i)); c != nil {
					held = append(held, c)
				}
			}
			if c := adminDial(t, addr, "127.0.7.9"); !closedAtAccept(c) {
				t.Error("a 9th address was kept past --admin-max-connections 6")
			}
			closeAll(held)
			if now := refused(t, "total"); now <= before {
				t.Errorf(`meshca_http_connections_refused_total{reason="total"} stayed at %v`, now)
			}
		}},
	}
}

// holdTCP opens n connections from the address from that send nothing.
func holdTCP(t *testing.T, addr, from string, n int) []net.Conn {
	var held []net.Conn
	for i := range n {
		c := adminDial(t, addr, from)
		if c == nil {
			t.Fatalf("connection %d of %d from %s refused", i+1, n, from)
		}
		held = append(held, c)
	}
	return held
}

// adminDial connects from the address from; nil when the server reset the
// connection before connect returned.
func adminDial(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedAtAccept says whether the server closed c within 2 s, before any
// request (nil: before connect returned).
func closedAtAccept(c net.Conn) bool {
	if c == nil {
		return true
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// getFrom asks for /healthz from the address from, on a connection it
// keeps alive, and returns the status code (0: no answer).
func getFrom(t *testing.T, addr, from string) int {
	t.Helper()
	c := adminDial(t, addr, from)
	if c == nil {
		return 0
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: meshca\r\n\r\n"); err != nil {
		return 0
	}
	r, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	r.Body.Close()
	return r.StatusCode
}
