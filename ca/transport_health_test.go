package ca_test

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// healthFrom is a health client of f connecting from the address from.
func healthFrom(t *testing.T, f *fixture, from string) healthpb.HealthClient {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	cc, err := grpc.NewClient(f.addr,
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: f.roots, ServerName: "istiod.istio-system.svc", MinVersion: tls.VersionTLS12})),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

// watch starts a Watch of service and returns its first answer, or the
// error it ended with; cancel ends it.
func watch(t *testing.T, hc healthpb.HealthClient, service string) (st healthpb.HealthCheckResponse_ServingStatus, cancel func(), err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return 0, cancel, err
	}
	r, err := w.Recv()
	return r.GetStatus(), cancel, err
}

// TestHealthWatchBounded: Watch answers for the two names the server
// reports and refuses any other at once (NotFound, as Check does),
// however long; watches are capped per address and in all, a watch that
// ends giving its place back; Check, what kubelet's gRPC probe uses,
// answers whatever the watches.
func TestHealthWatchBounded(t *testing.T) {
	f, reg := guardedFixture(t, limit.ConnLimits{MaxHealthWatchesPerPeer: 2, MaxHealthWatches: 3})
	a, b, c := healthFrom(t, f, "127.0.0.1"), healthFrom(t, f, "127.0.0.2"), healthFrom(t, f, "127.0.0.3")
	const notFound = `unknown service: this server reports the health of "" (the server) and "istio.v1.auth.IstioCertificateService"`
	for _, name := range []string{"istio.v1.auth.IstioCertificateServiceX", "grpc.health.v1.Health", strings.Repeat("x", 60<<10)} {
		start := time.Now()
		_, _, err := watch(t, a, name)
		if st := status.Convert(err); st.Code() != codes.NotFound || st.Message() != notFound || time.Since(start) > 2*time.Second {
			t.Errorf("Watch of a %d-byte unknown name: %v after %v, want NotFound %q at once", len(name), err, time.Since(start), notFound)
		}
	}
	tests := []struct {
		name    string
		hc      healthpb.HealthClient
		service string
		code    codes.Code
		msg     string
	}{
		{"the server", a, "", codes.OK, ""},
		{"the CA service", a, "istio.v1.auth.IstioCertificateService", codes.OK, ""},
		{"past the address's cap", a, "", codes.ResourceExhausted, "this address already watches the health service 2 times, the most it may; use Check"},
		{"another address", b, "", codes.OK, ""},
		{"past the total", c, "", codes.ResourceExhausted, "the health service has 3 watchers, the most it serves; use Check"},
	}
	var cancels []func()
	for _, tt := range tests {
		st, cancel, err := watch(t, tt.hc, tt.service)
		cancels = append(cancels, cancel)
		if s := status.Convert(err); s.Code() != tt.code || s.Message() != tt.msg || tt.code == codes.OK && st != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%s: %v %v, want %v %q", tt.name, st, err, tt.code, tt.msg)
		}
	}
	for _, hc := range []healthpb.HealthClient{a, b, c} {
		if r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check with the watches at their caps: %v %v", r.GetStatus(), err)
		}
	}
	cancels[0]()
	waitFor(t, 5*time.Second, func() bool {
		st, _, err := watch(t, c, "")
		return err == nil && st == healthpb.HealthCheckResponse_SERVING
	}, "a watch from 127.0.0.3 once one from 127.0.0.1 ended")
	wantSample(t, reg, "meshca_streams_refused_total", map[string]string{"reason": "watch_per_peer"}, 1)
}
