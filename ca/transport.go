package ca

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"

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
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = x509.NewCertPool()
		if b, err := bundles.GetX509BundleForTrustDomain(td); err == nil {
			c.ClientCAs = keymgr.Pool(b.X509Authorities()...)
		}
		return c, nil
	}
	return base
}

// NewGRPCServer returns a gRPC server over TLS serving s. The header list
// of a request is bounded by s's MaxHeaderBytes (grpc-go would otherwise
// accept 16 MiB), so that a huge token is refused by the transport before
// it is held in memory. Every RPC is counted and timed by method and code
// in s's Metrics (grpc_server_*), its series there from the start.
func NewGRPCServer(s *Server, tc *tls.Config, opts ...grpc.ServerOption) *grpc.Server {
	s.decode = newRequestCodec()
	opts = append([]grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(tc)),
		grpc.ForceServerCodecV2(s.decode),
		grpc.MaxRecvMsgSize(MaxRequestBytes),
		grpc.MaxHeaderListSize(uint32(s.c.MaxHeaderBytes)),
		grpc.ChainUnaryInterceptor(s.c.Metrics.grpc.UnaryServerInterceptor()),
	}, opts...)
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
