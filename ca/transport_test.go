package ca_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/internal/testca"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// hugeHeaderRequest speaks HTTP/2 to addr as an attacker would: it
// ignores the server's SETTINGS_MAX_HEADER_LIST_SIZE and sends one
// CreateCertificate whose bearer token is tokenBytes long, then reads
// until the server answers, resets the stream or closes. It returns how
// the server ended the request: "rst <code>", "status <grpc-status>",
// "goaway" or "closed".
func hugeHeaderRequest(t *testing.T, addr string, tc *tls.Config, tokenBytes int) string {
	conn, err := tls.Dial("tcp", addr, tc)
	if err != nil {
		t.Errorf("dial: %v", err)
		return "dial failed"
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "https"},
		{Name: ":path", Value: "/istio.v1.auth.IstioCertificateService/CreateCertificate"},
		{Name: ":authority", Value: "istiod.istio-system.svc"},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
		{Name: "authorization", Value: "Bearer " + strings.Repeat("a", tokenBytes)},
	} {
		_ = enc.WriteField(f)
	}
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		return "closed"
	}
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	_ = fr.WriteSettings()
	const chunk = 16 << 10
	b := block.Bytes()
	first := b[:min(chunk, len(b))]
	b = b[len(first):]
	if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndHeaders: len(b) == 0}) != nil {
		return "closed"
	}
	for len(b) > 0 {
		n := min(chunk, len(b))
		if fr.WriteContinuation(1, n == len(b), b[:n]) != nil {
			return "closed"
		}
		b = b[n:]
	}
	// An empty IstioCertificateRequest: uncompressed, zero length.
	_ = fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return "closed"
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			return "rst " + f.ErrCode.String()
		case *http2.GoAwayFrame:
			return "goaway"
		case *http2.MetaHeadersFrame:
			if s := f.PseudoValue("status"); s != "" && s != "200" {
				return "http " + s
			}
			for _, h := range f.RegularFields() {
				if h.Name == "grpc-status" {
					return "status " + h.Value
				}
			}
		}
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestHugeHeadersKeepHeapBounded: 100 concurrent requests with a 1 MiB
// token each, from a client that ignores the advertised header limit, hold
// almost nothing in the server's heap and never reach an authenticator.
// Without the limit each token would be held whole while it is
// authenticated (100 MiB here).
func TestHugeHeadersKeepHeapBounded(t *testing.T) {
	const (
		clients    = 100
		tokenBytes = 1 << 20
		bound      = 32 << 20
	)
	root := testca.NewRoot(t, "root", testca.Options{})
	g := newGate("")
	f := newFixture(t, root.Authority(), options{authn: anyToken{g}})
	defer close(g.release)
	tc := &tls.Config{RootCAs: f.roots, ServerName: "istiod.istio-system.svc", NextProtos: []string{"h2"}}
	before := heapInUse()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[string]int{}
	)
	for range clients {
		wg.Go(func() {
			o := hugeHeaderRequest(t, f.addr, tc, tokenBytes)
			mu.Lock()
			outcomes[o]++
			mu.Unlock()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	// Measure once every request was answered, or once they have all
	// reached authentication and are held there.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for g.calls.Load() < clients {
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("requests neither answered nor authenticated in time")
		case <-time.After(10 * time.Millisecond):
			continue
		}
		break
	}
	grown := int64(heapInUse()) - int64(before)
	<-done
	// The transport refuses the header list itself (a 1 MiB value closes
	// the connection; a list just over the limit resets the stream)
	// before any handler runs: no request gets a gRPC status.
	for o := range outcomes {
		if strings.HasPrefix(o, "status") || strings.HasPrefix(o, "http") {
			t.Errorf("outcomes %v: a handler answered; want every request refused by the transport", outcomes)
		}
	}
	if n := g.calls.Load(); n != 0 {
		t.Errorf("%d oversized tokens reached an authenticator", n)
	}
	if grown > bound {
		t.Fatalf("heap grew by %d MiB with %d requests in flight, want under %d MiB", grown>>20, clients, bound>>20)
	}
	t.Logf("heap grew by %.1f MiB for %d requests with %d KiB tokens", float64(grown)/(1<<20), clients, tokenBytes>>10)
}

// anyToken hands every request with a token to its gate.
type anyToken struct{ g *gate }

func (a anyToken) Authenticate(ctx context.Context, c *ca.Credentials) (*ca.Caller, error) {
	if c.Token == "" {
		return nil, ca.ErrNoCredentials
	}
	a.g.calls.Add(1)
	select {
	case <-a.g.release:
	case <-ctx.Done():
	}
	return nil, ca.ErrNoCredentials
}

// TestHealth: grpc.health.v1.Health answers on the CA's TLS port without
// credentials, for the server ("") and for IstioCertificateService, as
// the ready func says: NOT_SERVING until Run first asks it and while it
// fails, SERVING while it passes, NOT_SERVING for good from Shutdown on.
// A probe is no CA request: not audited, not counted, and probes spend
// none of their address's authentication failures (a budget of one here).
func TestHealth(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	rec := &recorder{}
	var (
		ready atomic.Bool
		h     *ca.Health
	)
	f := newFixture(t, root.Authority(), options{
		register: func(g *grpc.Server) {
			h = ca.RegisterHealth(g, func() error {
				if !ready.Load() {
					return errors.New("the Pod cache has not synced")
				}
				return nil
			})
		},
		config: func(c *ca.Config) {
			c.Audit, c.Limits = rec, limit.Limits{PeerFailureRate: 0.001, PeerFailureBurst: 1}
		},
	})
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{RootCAs: f.roots, ServerName: "istiod.istio-system.svc", MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	check := func(service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		return r.GetStatus(), err
	}
	// await waits for both names to report want: Run asks ready once a
	// second.
	await := func(step string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, service := range []string{"", "istio.v1.auth.IstioCertificateService"} {
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				got, err := check(service)
				if err == nil && got == want {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: service %q is %v (%v), want %v", step, service, got, err, want)
				}
			}
		}
	}

	await("registered, Run not started", healthpb.HealthCheckResponse_NOT_SERVING)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = h.Run(ctx) }()
	for _, step := range []struct {
		name  string
		ready bool
		want  healthpb.HealthCheckResponse_ServingStatus
	}{
		{"not ready", false, healthpb.HealthCheckResponse_NOT_SERVING},
		{"ready", true, healthpb.HealthCheckResponse_SERVING},
		{"no longer ready", false, healthpb.HealthCheckResponse_NOT_SERVING},
		{"ready again", true, healthpb.HealthCheckResponse_SERVING},
	} {
		ready.Store(step.ready)
		await(step.name, step.want)
	}
	for range 50 {
		if got, err := check(""); err != nil || got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("probe: %v %v, want SERVING", got, err)
		}
	}
	if _, err := check("istio.v1.auth.IstioCertificateServiceX"); status.Code(err) != codes.NotFound {
		t.Errorf("unknown service: %v, want NotFound", err)
	}

	// One CA request after the probes, from the same address: served, and
	// the only request counted and audited.
	if _, err := f.client(t, "good", nil).Fetch(context.Background(), frontend, caclient.Options{}); err != nil {
		t.Fatalf("a CA request after the probes: %v", err)
	}
	for _, m := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"citadel_server_csr_count", nil, 1},
		{"citadel_server_authentication_failure_count", nil, 0},
		{"meshca_rate_limited_total", map[string]string{"reason": "peer_authn_failures"}, 0},
		{"grpc_server_started_total", map[string]string{"grpc_service": "istio.v1.auth.IstioCertificateService"}, 1},
	} {
		wantSample(t, f.reg, m.name, m.labels, m.want)
	}
	rec.mu.Lock()
	events := len(rec.events)
	rec.mu.Unlock()
	if events != 1 {
		t.Errorf("%d audit events, want the CA request's alone", events)
	}

	// Shutdown holds however ready the server still is, and whatever Run
	// sees after it.
	h.Shutdown()
	await("shut down", healthpb.HealthCheckResponse_NOT_SERVING)
	for _, r := range []bool{false, true} {
		ready.Store(r)
		time.Sleep(1200 * time.Millisecond) // Run asks ready again
	}
	await("shut down, after Run saw ready change", healthpb.HealthCheckResponse_NOT_SERVING)
}
