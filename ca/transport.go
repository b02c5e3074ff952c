package ca

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"slices"
	"sync"

	"github.com/meshca/meshca/keymgr"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
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
		cfg.ClientCAs = keymgr.Pool(roots...)
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
	}, s.c.Conn.serverOptions()...), opts...)
	g := grpc.NewServer(opts...)
	authpb.RegisterIstioCertificateServiceServer(g, s)
	s.c.Metrics.grpc.InitializeMetrics(g)
	return g
}

// AdminHandler serves /metrics from g, /healthz (the process is alive)
// and /readyz (ready returns nil).
func AdminHandler(g prometheus.Gatherer, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
