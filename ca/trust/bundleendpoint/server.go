package bundleendpoint

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Endpoint profiles of the SPIFFE Federation specification.
const (
	// ProfileSPIFFE: the endpoint presents an X509-SVID of its own trust
	// domain; clients know its SPIFFE ID and a first bundle.
	ProfileSPIFFE = "https_spiffe"
	// ProfileWeb: the endpoint presents a certificate clients verify as
	// any HTTPS server's, for its DNS name or IP.
	ProfileWeb = "https_web"
)

// Request results passed to Observer.
const (
	// ResultServed: the bundle was sent.
	ResultServed = "served"
	// ResultRefused: not a GET.
	ResultRefused = "refused"
	// ResultError: no bundle to send (HTTP 500).
	ResultError = "error"
)

// Observer counts requests by result (one of the Result* constants).
type Observer interface {
	ObserveRequest(result string)
}

// Config configures a Server. Listener, TrustDomain, Source and
// GetCertificate are required.
type Config struct {
	// Listener is where the endpoint serves, already bound; the Server
	// closes it.
	Listener    net.Listener
	TrustDomain spiffeid.TrustDomain
	Source      *Source
	// GetCertificate returns the certificate the endpoint presents: an
	// X509-SVID for ProfileSPIFFE, the operator's for ProfileWeb.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Observer, when set, counts requests.
	Observer Observer
	// Logger hears of requests that got no bundle; nil discards.
	Logger *slog.Logger
	// Limits bound the endpoint's requests: its timeouts and header bound
	// (zero fields: limit.HTTPLimits' defaults).
	Limits limit.HTTPLimits
	// Conns, when set, caps the endpoint's connections before their TLS
	// handshake.
	Conns *limit.HTTPConns
}

// Server is a running bundle endpoint.
type Server struct {
	lis  net.Listener
	http *http.Server
}

// shutdownTimeout bounds how long Run waits for requests in flight once
// its context ends.
const shutdownTimeout = 5 * time.Second

// New assembles a Server; it serves once Run is called.
func New(c Config) (*Server, error) {
	switch {
	case c.Listener == nil:
		return nil, errors.New("bundleendpoint: no listener")
	case c.TrustDomain.IsZero():
		return nil, errors.New("bundleendpoint: no trust domain")
	case c.Source == nil:
		return nil, errors.New("bundleendpoint: no bundle source")
	case c.GetCertificate == nil:
		return nil, errors.New("bundleendpoint: no certificate to present")
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h, err := federation.NewHandler(c.TrustDomain, c.Source, federation.WithLogger(spiffeLogger{log}))
	if err != nil {
		return nil, fmt.Errorf("bundleendpoint: %w", err)
	}
	if c.Observer != nil {
		h = observed(h, c.Observer)
	}
	srv := c.Limits.Server(h)
	srv.TLSConfig = TLSConfig(c.GetCertificate)
	srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	lis := c.Listener
	if c.Conns != nil {
		lis = c.Conns.Attach(srv, lis)
	}
	return &Server{lis: lis, http: srv}, nil
}

// Addr is the address the Server listens on.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Run serves until ctx ends, then stops taking connections and waits for
// the requests in flight (at most 5 s). It returns nil then, or why it
// could not serve.
func (s *Server) Run(ctx context.Context) error {
	served := make(chan error, 1)
	go func() { served <- s.http.ServeTLS(s.lis, "", "") }()
	select {
	case err := <-served:
		return fmt.Errorf("bundleendpoint: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := s.http.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = s.http.Close()
	}
	<-served
	return err
}

// TLSConfig is the endpoint's TLS configuration: TLS 1.2 or later with
// the forward-secret AEAD suites of Mozilla's intermediate profile, which
// the Federation specification requires of endpoints, and no client
// certificate asked for (the specification forbids client
// authentication).
func TLSConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		GetCertificate: getCert,
		MinVersion:     tls.VersionTLS12,
		ClientAuth:     tls.NoClientCert,
		CipherSuites: []uint16{
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
		},
	}
}

// observed counts each request of h by the status it answered with.
func observed(h http.Handler, o Observer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		switch {
		case sw.status == http.StatusOK:
			o.ObserveRequest(ResultServed)
		case sw.status == http.StatusMethodNotAllowed:
			o.ObserveRequest(ResultRefused)
		default:
			o.ObserveRequest(ResultError)
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

// spiffeLogger is go-spiffe's logger.Logger on slog: the handler logs only
// requests that got no bundle.
type spiffeLogger struct{ log *slog.Logger }

func (l spiffeLogger) Debugf(format string, args ...any) { l.log.Debug(fmt.Sprintf(format, args...)) }
func (l spiffeLogger) Infof(format string, args ...any)  { l.log.Info(fmt.Sprintf(format, args...)) }
func (l spiffeLogger) Warnf(format string, args ...any)  { l.log.Warn(fmt.Sprintf(format, args...)) }
func (l spiffeLogger) Errorf(format string, args ...any) { l.log.Error(fmt.Sprintf(format, args...)) }
