package ca_test

import (
	"context"
	"crypto/tls"
	"errors"
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
	reg := prometheus.NewRegistry()
	g := limit.NewConnGuard(limit.ConnGuardConfig{Limits: lim, Registerer: reg})
	root := testca.NewRoot(t, "root", testca.Options{})
	f := newFixture(t, root.Authority(), options{guard: g, register: func(s *grpc.Server) {
		h := ca.RegisterHealth(s, func() error { return nil })
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go func() { _ = h.Run(ctx) }()
	}})
	return f, reg
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

// TestConnGuardHandshakeTimeout: a connection that does not finish its
// TLS handshake and HTTP/2 preface in time is closed; one that did stays.
func TestConnGuardHandshakeTimeout(t *testing.T) {
	f, reg := guardedFixture(t, limit.ConnLimits{TLSHandshakeTimeout: 300 * time.Millisecond, MaxUnauthenticatedIdle: limit.NoLimit})
	silent, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
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
	if ga := served.readUntil(t, time.Now().Add(time.Second)); ga != nil {
		t.Fatalf("a served connection got GOAWAY %v %q", ga.ErrCode, ga.DebugData())
	}
	wantSample(t, reg, "meshca_connections_refused_total", map[string]string{"reason": "handshake_timeout"}, 2)
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
