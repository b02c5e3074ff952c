package serve_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/ca/serve"
)

// TestAssembleAdminBindsOneAddress: an admin address with a host (what
// --admin-bind-address makes of the Pod's IP) is served on that address
// alone: /healthz answers there, and the same port on another address of
// the host refuses the connection.
func TestAssembleAdminBindsOneAddress(t *testing.T) {
	c := config(t)
	c.AdminListen = "127.0.0.2:0"
	p := start(t, c)
	host, port, err := net.SplitHostPort(p.Addresses().Admin)
	if err != nil || host != "127.0.0.2" {
		t.Fatalf("admin bound %q (%v), want 127.0.0.2", p.Addresses().Admin, err)
	}
	r, err := http.Get("http://" + net.JoinHostPort(host, port) + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("/healthz on 127.0.0.2: %s", r.Status)
	}
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), 2*time.Second); err == nil {
		conn.Close()
		t.Fatalf("127.0.0.1:%s accepted a connection: the admin server listens beyond 127.0.0.2", port)
	}
}

// TestAssembleHTTPLimits: Config.Admin and BundleEndpoint.Limits reach
// the admin port's server and the bundle endpoint's: a kept-alive
// connection closes once idle, and an address past its cap is closed at
// accept, counted under its server.
func TestAssembleHTTPLimits(t *testing.T) {
	c := config(t)
	lim := limit.HTTPLimits{IdleTimeout: 300 * time.Millisecond, MaxConnectionsPerPeer: 1}
	c.Admin = lim
	c.BundleEndpoint = serve.BundleEndpoint{Listen: "127.0.0.1:0", ID: endpointID, Limits: lim}
	p := start(t, c)
	a := p.Addresses()
	for _, s := range []struct {
		server, addr string
		tls          bool
	}{{"admin", a.Admin, false}, {"bundle_endpoint", a.BundleEndpoint, true}} {
		t.Run(s.server, func(t *testing.T) {
			dial := func() (net.Conn, error) {
				d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
				if s.tls {
					return tls.DialWithDialer(d, "tcp", s.addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
				}
				return d.Dial("tcp", s.addr)
			}
			c, err := dial()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: meshca\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			r, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, r.Body)
			start := time.Now()
			_ = c.SetReadDeadline(start.Add(5 * time.Second))
			if _, err := io.Copy(io.Discard, br); isTimeout(err) {
				t.Fatalf("the kept-alive connection was still open after %v", time.Since(start).Round(time.Millisecond))
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("the kept-alive connection closed after %v, want about 300ms", took.Round(time.Millisecond))
			}
			// One held before its request; a second from the address is
			// closed at once.
			held, err := dial()
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			if second, err := dial(); err == nil {
				_ = second.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := second.Read(make([]byte, 1)); err == nil || isTimeout(err) {
					t.Errorf("a second connection from the address was kept (%v)", err)
				}
				second.Close()
			}
			want := `meshca_http_connections_refused_total{reason="per_peer",server="` + s.server + `"} 1`
			if m := metrics(t, p); !strings.Contains(m, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		})
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
