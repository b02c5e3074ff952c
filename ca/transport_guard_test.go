package ca_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/internal/testca"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// guardedFixture is a fixture behind a ConnGuard with lim, which
// registers its metrics with the registry returned.
func guardedFixture(t *testing.T, lim limit.ConnLimits) (*fixture, *prometheus.Registry) {
	t.Helper()
	return guardedFixtureWith(t, lim, options{})
}

// guardedFixtureWith is guardedFixture with the options o besides.
func guardedFixtureWith(t *testing.T, lim limit.ConnLimits, o options) (*fixture, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o.guard = limit.NewConnGuard(limit.ConnGuardConfig{Limits: lim, Registerer: reg})
	o.register = func(s *grpc.Server) {
		h := ca.RegisterHealth(s, func() error { return nil })
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go func() { _ = h.Run(ctx) }()
	}
	root := testca.NewRoot(t, "root", testca.Options{})
	return newFixture(t, root.Authority(), o), reg
}

// closedWithin reports whether the server closes c within d, reading (and
// dropping) whatever it sends meanwhile.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			return !errors.Is(err, os.ErrDeadlineExceeded)
		}
	}
}

// clientHello returns the first TLS record a client sends: its
// ClientHello.
func clientHello(t *testing.T) []byte {
	t.Helper()
	client, server := net.Pipe()
	defer server.Close()
	go func() {
		_ = tls.Client(client, &tls.Config{ServerName: "istiod.istio-system.svc"}).Handshake()
		client.Close()
	}()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(server, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(server, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// TestConnGuardHandshakeTimeout: a connection that does not finish its
// TLS handshake and HTTP/2 preface in time is closed, whether it sent
// nothing, half a ClientHello or no preface after its handshake; one
// that did stays.
func TestConnGuardHandshakeTimeout(t *testing.T) {
	f, reg := guardedFixture(t, limit.ConnLimits{TLSHandshakeTimeout: 300 * time.Millisecond, MaxUnauthenticatedIdle: limit.NoLimit})
	silent, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	halfHello, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer halfHello.Close()
	hello := clientHello(t)
	if _, err := halfHello.Write(hello[:len(hello)/2]); err != nil {
		t.Fatal(err)
	}
	half, err := tls.Dial("tcp", f.addr, &tls.Config{RootCAs: f.roots, ServerName: "istiod.istio-system.svc", NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	served := dialH2(t, f)
	if !closedWithin(silent, 5*time.Second) {
		t.Error("a connection that sent nothing is still open 5s past the 300ms handshake timeout")
	}
	if !closedWithin(half, 5*time.Second) {
		t.Error("a connection without an HTTP/2 preface is still open 5s past the 300ms handshake timeout")
	}
	if !closedWithin(halfHello, 5*time.Second) {
		t.Error("a connection that sent half a ClientHello is still open 5s past the 300ms handshake timeout")
	}
	if ga := served.readUntil(t, time.Now().Add(time.Second)); ga != nil {
		t.Fatalf("a served connection got GOAWAY %v %q", ga.ErrCode, ga.DebugData())
	}
	wantSample(t, reg, "meshca_connections_refused_total", map[string]string{"reason": "handshake_timeout"}, 3)
	wantSample(t, reg, "meshca_connections_open", nil, 1)
}

// TestConnGuardUnauthenticatedAge: a connection on which no request has
// authenticated is closed at MaxUnauthenticatedAge, a health watch in
// progress on it or not; an authenticated client keeps its connection.
func TestConnGuardUnauthenticatedAge(t *testing.T) {
	const age = time.Second
	f, reg := guardedFixture(t, limit.ConnLimits{MaxUnauthenticatedAge: age, MaxUnauthenticatedIdle: limit.NoLimit})
	good := f.client(t, "good", nil)
	if _, err := good.Fetch(context.Background(), frontend, caclient.Options{}); err != nil {
		t.Fatal(err)
	}
	_, _, err := watch(t, healthFrom(t, f, "127.0.0.2"), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), age+5*time.Second)
	defer cancel()
	w, err := healthFrom(t, f, "127.0.0.3").Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		if _, err = w.Recv(); err != nil {
			break
		}
	}
	if took := time.Since(start); status.Code(err) != codes.Unavailable || took > age+3*time.Second {
		t.Fatalf("a watch on an unauthenticated connection: %v after %v, want Unavailable at the connection's age of %v", err, took, age)
	}
	time.Sleep(age / 2)
	if _, err := good.Fetch(context.Background(), frontend, caclient.Options{}); err != nil {
		t.Fatal(err)
	}
	// The two watchers' connections; not the authenticated client's.
	waitFor(t, 5*time.Second, func() bool {
		v, _ := sample(t, reg, "meshca_connections_refused_total", map[string]string{"reason": "unauthenticated_age"})
		return v == 2
	}, "two connections closed for their age")
	wantSample(t, reg, "meshca_connections_open", nil, 1)
}

// TestConnGuardUnauthenticatedIdle: a connection on which no request
// authenticated is closed once idle for MaxUnauthenticatedIdle, whether
// it sent no request or only refused ones; one whose request
// authenticated stays, and so does one with an RPC in progress.
func TestConnGuardUnauthenticatedIdle(t *testing.T) {
	const idle = 500 * time.Millisecond
	f, reg := guardedFixture(t, limit.ConnLimits{MaxUnauthenticatedIdle: idle})
	silent := dialH2(t, f)
	good := f.client(t, "good", nil)
	if _, err := good.Fetch(context.Background(), frontend, caclient.Options{}); err != nil {
		t.Fatal(err)
	}
	bad := f.client(t, "bad", nil)
	if _, err := bad.Fetch(context.Background(), frontend, caclient.Options{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("bad token: %v, want Unauthenticated", err)
	}
	cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: f.roots, ServerName: "istiod.istio-system.svc"})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	watch, err := healthpb.NewHealthClient(cc).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(silent.conn, 5*time.Second) {
		t.Fatal("a connection without a request is still open 5s past the 500ms unauthenticated idle limit")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, _ := sample(t, reg, "meshca_connections_refused_total", map[string]string{"reason": "unauthenticated_idle"})
		if v == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * idle)
	// The silent connection and the refused client's are closed; the
	// authenticated client's and the health watch's stay.
	wantSample(t, reg, "meshca_connections_refused_total", map[string]string{"reason": "unauthenticated_idle"}, 2)
	wantSample(t, reg, "meshca_connections_open", nil, 2)
	if _, err := good.Fetch(context.Background(), frontend, caclient.Options{}); err != nil {
		t.Fatalf("the authenticated client after %v idle: %v", 2*idle, err)
	}
	wantSample(t, reg, "meshca_connections_open", nil, 2)
}

// TestConnGuardLogsRarely: a flood of refusals is one debug line a
// second, which counts the refusals it left out.
