package e2e

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// bundleEndpointFlags serve the SPIFFE bundle endpoint beside the arena.
var bundleEndpointFlags = []string{"--bundle-endpoint-listen", "127.0.0.1:0"}

// headerTimeout is the ReadHeaderTimeout of the bundle endpoint and of
// the admin port: a client that has not sent its request's headers by
// then is cut off, and so is one that has not begun its TLS handshake.
const headerTimeout = 5 * time.Second

// slowClients are the connections that send too slowly, or not at all,
// started together so that their seconds overlap the other rows.
type slowClients struct {
	bundleHeaders, bundleHandshake, adminHeaders chan slowResult
	// Kept alive after one answer, then silent (issue 28, item 5).
	adminIdle, bundleIdle chan slowResult
}

// slowResult is how long the server kept a slow connection, and what it
// sent on it.
type slowResult struct {
	took time.Duration
	got  string
	err  error
}

func (a *arena) slowClients(_ *testing.T) *slowClients {
	s := &slowClients{make(chan slowResult, 1), make(chan slowResult, 1), make(chan slowResult, 1), make(chan slowResult, 1), make(chan slowResult, 1)}
	go func() { s.adminIdle <- keptAlive(a.s.AdminAddr, false) }()
	go func() { s.bundleIdle <- keptAlive(a.s.BundleAddr, true) }()
	go func() { s.bundleHeaders <- trickle(a.s.BundleAddr, true) }()
	go func() { s.bundleHandshake <- silent(a.s.BundleAddr) }()
	go func() { s.adminHeaders <- trickle(a.s.AdminAddr, false) }()
	return s
}

// trickle opens a connection (TLS when tlsOn) and sends a request's
// headers one line a second, never ending them (slowloris).
func trickle(addr string, tlsOn bool) slowResult {
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
	start := time.Now()
	read := make(chan slowResult, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(4 * headerTimeout))
		b, err := io.ReadAll(c)
		read <- slowResult{took: time.Since(start), got: string(b), err: err}
	}()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: meshca\r\n"); err != nil {
		return slowResult{err: err}
	}
	for i := 0; ; i++ {
		select {
		case r := <-read:
			return r
		case <-time.After(time.Second):
			_, _ = fmt.Fprintf(c, "X-Slow-%d: %d\r\n", i, i)
		}
	}
}

// silent opens a TCP connection to a TLS port and sends nothing.
func silent(addr string) slowResult {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return slowResult{err: err}
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(4 * headerTimeout))
	b, err := io.ReadAll(c)
	return slowResult{took: time.Since(start), got: string(b), err: err}
}

func (s *slowClients) checks(_ *testing.T, _ *arena) []check {
	cut := func(name, defence string, c chan slowResult) check {
		return check{name: name, defence: defence, run: func(t *testing.T) {
			r := <-c
			var ne net.Error
			switch {
			case r.err != nil && errors.As(r.err, &ne) && ne.Timeout():
				t.Fatalf("the connection was still open after %v", r.took.Round(time.Millisecond))
			case r.took < headerTimeout-time.Second || r.took > headerTimeout+3*time.Second:
				t.Errorf("closed after %v, want about %v (ReadHeaderTimeout)", r.took.Round(time.Millisecond), headerTimeout)
			case strings.Contains(r.got, "200 OK"):
				t.Errorf("the server answered: %.80q", r.got)
			}
			t.Logf("closed after %v (%v), having sent %d bytes", r.took.Round(time.Millisecond), r.err, len(r.got))
		}}
	}
	return []check{
		cut("bundle endpoint/headers trickled (slowloris)", "bundle_endpoint:read_header_timeout", s.bundleHeaders),
		cut("bundle endpoint/TLS handshake never begun", "bundle_endpoint:tls_handshake_timeout", s.bundleHandshake),
		cut("admin/headers trickled (slowloris)", "admin:read_header_timeout", s.adminHeaders),
		idleClosed("admin/a kept-alive connection left idle", "admin:idle_timeout", s.adminIdle),
		idleClosed("bundle endpoint/a kept-alive connection left idle", "bundle_endpoint:idle_timeout", s.bundleIdle),
	}
}

// httpChecks: the bundle endpoint serves one GET to anyone, over TLS
// as the SPIFFE Federation specification has it; the admin port serves
// /metrics, /healthz and /readyz, and Go's profiles only with
// --enable-pprof (the arena runs without it).
func (a *arena) httpChecks(_ *testing.T) []check {
	bundle := func(method string, headers []string, body string) func(t *testing.T) *http.Response {
		return func(t *testing.T) *http.Response {
			c, err := tls.Dial("tcp", a.s.BundleAddr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
			if err != nil {
				t.Fatal(err)
			}
			return rawRequest(t, c, method, "/", headers, body)
		}
	}
	admin := func(path string, headers ...string) func(t *testing.T) *http.Response {
		return func(t *testing.T) *http.Response {
			c, err := net.Dial("tcp", a.s.AdminAddr)
			if err != nil {
				t.Fatal(err)
			}
			return rawRequest(t, c, "GET", path, headers, "")
		}
	}
	refused := func(name, defence string, do func(t *testing.T) *http.Response, code int, body string) check {
		return check{name: name, defence: defence, run: func(t *testing.T) {
			r := do(t)
			b, _ := io.ReadAll(io.LimitReader(r.Body, 4<<10))
			if r.StatusCode != code || !strings.Contains(string(b), body) {
				t.Errorf("%s %.120q, want %d with %q", r.Status, b, code, body)
			}
		}}
	}
	notGet := func(method string) check {
		return check{name: "bundle endpoint/" + method, defence: "bundle_endpoint:method_not_allowed", run: func(t *testing.T) {
			refusals := func() float64 {
				return sampleValue(scrapeMetrics(t, a.s.AdminAddr), "meshca_bundle_endpoint_requests_total", "result", "refused")
			}
			before := refusals()
			r := bundle(method, []string{"Content-Length: 2"}, "{}")(t)
			if r.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s, want 405", r.Status)
			}
			if after := refusals(); after != before+1 {
				t.Errorf("meshca_bundle_endpoint_requests_total{result=refused} went from %v to %v, want one more", before, after)
			}
		}}
	}
	handshake := func(name, defence string, c *tls.Config, want string) check {
		return check{name: name, defence: defence, run: func(t *testing.T) {
			c.InsecureSkipVerify = true
			conn, err := tls.Dial("tcp", a.s.BundleAddr, c)
			if err == nil {
				conn.Close()
				t.Fatalf("handshake succeeded with %s", tls.CipherSuiteName(conn.ConnectionState().CipherSuite))
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("handshake: %v, want %q", err, want)
			}
		}}
	}
	pad := func(n int) string { return "X-Pad: " + strings.Repeat("a", n) }
	return []check{
		refused("bundle endpoint/a 64 KiB header", "bundle_endpoint:header_too_large", bundle("GET", []string{pad(64 << 10)}, ""),
			http.StatusRequestHeaderFieldsTooLarge, "431"),
		notGet("POST"),
		notGet("DELETE"),
		refused("bundle endpoint/plain HTTP on its TLS port", "bundle_endpoint:plaintext_http", func(t *testing.T) *http.Response {
			c, err := net.Dial("tcp", a.s.BundleAddr)
			if err != nil {
				t.Fatal(err)
			}
			return rawRequest(t, c, "GET", "/", nil, "")
		}, http.StatusBadRequest, "Client sent an HTTP request to an HTTPS server"),
		handshake("bundle endpoint/TLS 1.1", "bundle_endpoint:tls_min_version",
			&tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}, "protocol version"),
		handshake("bundle endpoint/TLS 1.2 without forward secrecy or AEAD", "bundle_endpoint:tls_cipher_suites",
			&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_RSA_WITH_AES_128_GCM_SHA256,
				tls.TLS_RSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA}},
			"handshake failure"),
		refused("admin/pprof index without --enable-pprof", "admin:pprof_disabled", admin("/debug/pprof/"), http.StatusNotFound, "404"),
		refused("admin/pprof cmdline without --enable-pprof", "admin:pprof_disabled", admin("/debug/pprof/cmdline"), http.StatusNotFound, "404"),
		refused("admin/a CPU profile without --enable-pprof", "admin:pprof_disabled", admin("/debug/pprof/profile?seconds=1"),
			http.StatusNotFound, "404"),
		refused("admin/expvar", "admin:unknown_path", admin("/debug/vars"), http.StatusNotFound, "404"),
		refused("admin/an unknown path", "admin:unknown_path", admin("/admin/config"), http.StatusNotFound, "404"),
		refused("admin/a 2 MiB header", "admin:header_too_large", admin("/metrics", pad(2<<20)),
			http.StatusRequestHeaderFieldsTooLarge, "431"),
		// Issue 28: 8 KiB, no longer net/http's 1 MiB.
		refused("admin/a 16 KiB header", "admin:header_too_large", admin("/metrics", pad(16<<10)),
			http.StatusRequestHeaderFieldsTooLarge, "431"),
	}
}

// rawRequest writes an HTTP/1.1 request to c, with headers after its
// Host header and then body, and reads the answer. The write runs beside
// the read: a server that refuses the request stops reading it.
func rawRequest(t *testing.T, c net.Conn, method, path string, headers []string, body string) *http.Response {
	t.Helper()
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var req strings.Builder
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: meshca\r\nConnection: close\r\n", method, path)
	for _, h := range headers {
		req.WriteString(h + "\r\n")
	}
	req.WriteString("\r\n" + body)
	go func() { _, _ = io.WriteString(c, req.String()) }()
	r, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}
