package ca

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/keymgr/certs"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"
)

// MaxRequestBytes bounds a CreateCertificate message: a CSR is a few KiB.
const MaxRequestBytes = 64 << 10

// TLSConfig returns the server's TLS configuration: the serving certificate
// from getCert, and client certificates verified against the current trust
// bundle when a client sends one (istio-agent renews with its SVID; ztunnel
// sends none).
func TLSConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), td spiffeid.TrustDomain, bundles x509bundle.Source) *tls.Config {
	base := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: getCert,
		ClientAuth:     tls.VerifyClientCertIfGiven,
	}
	cache := &clientCAConfig{base: base, td: td, bundles: bundles}
	base.GetConfigForClient = cache.get
	return base
}

// clientCAConfig is the configuration of a handshake: the base with the
// current trust bundle as client CAs, built once per bundle rather than
// once per connection (a connection keeps its configuration, and 10,000
// of them would keep 10,000 copies of the pool).
type clientCAConfig struct {
	base    *tls.Config
	td      spiffeid.TrustDomain
	bundles x509bundle.Source

	mu    sync.Mutex
	roots []*x509.Certificate // of cfg
	cfg   *tls.Config
}

func (c *clientCAConfig) get(*tls.ClientHelloInfo) (*tls.Config, error) {
	var roots []*x509.Certificate
	if b, err := c.bundles.GetX509BundleForTrustDomain(c.td); err == nil {
		roots = b.X509Authorities()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg == nil || !slices.EqualFunc(roots, c.roots, (*x509.Certificate).Equal) {
		cfg := c.base.Clone()
		cfg.GetConfigForClient = nil
		cfg.ClientCAs = certs.Pool(roots...)
		c.cfg, c.roots = cfg, roots
	}
	return c.cfg, nil
}

// NewGRPCServer returns a gRPC server over TLS serving s. The header list
// of a request is bounded by s's MaxHeaderBytes (grpc-go would otherwise
// accept 16 MiB), so that a huge token is refused by the transport before
// it is held in memory; its connections by s's ConnLimits. Every RPC is
// counted and timed by method and code in s's Metrics (grpc_server_*),
// its series there from the start.
func NewGRPCServer(s *Server, tc *tls.Config, opts ...grpc.ServerOption) *grpc.Server {
	s.decode = newRequestCodec()
	opts = append(append([]grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(tc)),
		grpc.ForceServerCodecV2(s.decode),
		grpc.MaxRecvMsgSize(MaxRequestBytes),
		grpc.MaxHeaderListSize(uint32(s.c.MaxHeaderBytes)),
		grpc.ChainUnaryInterceptor(s.c.Metrics.grpc.UnaryServerInterceptor()),
	}, s.c.Conn.ServerOptions()...), opts...)
	g := grpc.NewServer(opts...)
	authpb.RegisterIstioCertificateServiceServer(g, s)
	s.c.Metrics.grpc.InitializeMetrics(g)
	return g
}

// GuardOptions are the gRPC server options that put g in front of every
// connection's RPCs: its stats handler, and its tap, which admits each
// stream when its headers arrive, before grpc-go spends a goroutine on
// it (limit.ConnGuard.AdmitStream). A stream it refuses gets
// ResourceExhausted, with the retry hint, as a trailers-only answer.
// With them, give the server g's Listener.
func GuardOptions(g *limit.ConnGuard) []grpc.ServerOption {
	admit := func(ctx context.Context, info *tap.Info) (context.Context, error) {
		ctx, err := g.AdmitStream(ctx, headerListSize(info.Header))
		if err != nil {
			return nil, classify(err).Status()
		}
		return ctx, nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(g), grpc.InTapHandle(admit)}
}

// headerListSize is the size of a header list as HTTP/2 counts it
// (RFC 9113 6.5.2): each field's name and value, and 32 bytes.
func headerListSize(md metadata.MD) int {
	n := 0
	for k, vs := range md {
		for _, v := range vs {
			n += len(k) + len(v) + 32
		}
	}
	return n
}

// AdminHandler serves /metrics from g, /healthz (the process is alive)
// and /readyz (each of ready's checks and its state; 503 when one fails).
func AdminHandler(g prometheus.Gatherer, ready Readiness) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("/readyz", ready)
	return mux
}

// Health serves grpc.health.v1.Health on the CA's gRPC server, so that a
// gRPC probe asks the port clients use. For the whole server ("") and
// for IstioCertificateService its status follows the readiness the admin
// /readyz reports: SERVING while ready returns nil, NOT_SERVING before,
// while it returns an error and from Shutdown on. A health RPC takes
// none of the CA's steps: no credentials, no authentication budget, no
// audit event, no CA metric (grpc_server_* count it under its own
// service). Watch answers only for those two names (NotFound for any
// other, as Check) and within the connection guard's caps on watches
// (limit.AdmitWatch): a watch is a stream held open without credentials.
type Health struct {
	srv   *health.Server
	ready func() error

	mu   sync.Mutex
	last healthpb.HealthCheckResponse_ServingStatus
	shut bool
}

// healthPoll is how often Run asks ready: grpc-go's health server is told
// of a change, it does not ask. A second is well under a probe's period.
const healthPoll = time.Second

// healthServices are the service names whose status Health sets: the
// server as a whole, and the CA service by its full name.
var healthServices = []string{"", authpb.IstioCertificateService_ServiceDesc.ServiceName}

// RegisterHealth serves the health service on g, NOT_SERVING until Run
// first asks ready.
func RegisterHealth(g *grpc.Server, ready func() error) *Health {
	h := &Health{srv: health.NewServer(), ready: ready, last: healthpb.HealthCheckResponse_NOT_SERVING}
	for _, name := range healthServices {
		h.srv.SetServingStatus(name, h.last)
	}
	healthpb.RegisterHealthServer(g, guardedHealth{h.srv})
	return h
}

// guardedHealth is grpc-go's health server with Watch bounded.
type guardedHealth struct{ *health.Server }

// Watch refuses a service name Health does not report, at once, and a
// watch past the guard's caps; then it is grpc-go's.
func (h guardedHealth) Watch(in *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	if !slices.Contains(healthServices, in.GetService()) {
		return classify(refuse(codes.NotFound, "health_unknown_service",
			fmt.Sprintf("unknown service: this server reports the health of %q (the server) and %q", healthServices[0], healthServices[1]), nil)).Status()
	}
	if err := limit.AdmitWatch(stream.Context()); err != nil {
		return classify(err).Status()
	}
	return h.Server.Watch(in, stream)
}

// Run keeps the status in step with ready until ctx ends. It leaves the
// status as it is then: Shutdown, called as the server stops, turns it
// NOT_SERVING.
func (h *Health) Run(ctx context.Context) error {
	t := time.NewTicker(healthPoll)
	defer t.Stop()
	for {
		h.update()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (h *Health) update() {
	st := healthpb.HealthCheckResponse_SERVING
	if h.ready() != nil {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// After Shutdown grpc-go ignores a change and logs that it did.
	if h.shut || st == h.last {
		return
	}
	h.last = st
	for _, name := range healthServices {
		h.srv.SetServingStatus(name, st)
	}
}

// Shutdown turns every status NOT_SERVING for good. Call it before the
// server's GracefulStop, so that a probe on a connection still open
// while requests drain is told the server is going. A Watch stream
// still open keeps GracefulStop waiting, as any open RPC does.
func (h *Health) Shutdown() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.shut = true
	h.srv.Shutdown()
}
