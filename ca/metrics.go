package ca

import (
	"context"
	"errors"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/signer"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Metrics are the server's Prometheus collectors. Istio's citadel_* names
// are kept (without a _total suffix) because operators alert on them; the
// meshca_* series add the reason label that explains every refusal, and
// grpc_server_* (go-grpc-middleware's provider) count every RPC by method
// and code.
type Metrics struct {
	csrCount       prometheus.Counter
	authnFailures  prometheus.Counter
	issued         prometheus.Counter
	signErrors     *prometheus.CounterVec
	csrParseErrors prometheus.Counter
	idErrors       prometheus.Counter
	requests       *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	signDuration   *prometheus.HistogramVec
	backendErrors  *prometheus.CounterVec
	rateLimited    *prometheus.CounterVec
	inFlight       prometheus.Gauge
	grpc           *grpcprom.ServerMetrics
	rootExpiry     prometheus.GaugeFunc
	rootExpirySecs prometheus.GaugeFunc
	chainExpiry    prometheus.GaugeFunc
	chainExpirySec prometheus.GaugeFunc
}

// ExpirySource reports when the roots and the signing chain expire.
type ExpirySource interface {
	RootNotAfter() time.Time
	ChainNotAfter() time.Time
}

// signErrorKinds are the kind label values of meshca_sign_errors_total:
// signer's kinds, and canceled (the client gave up; not the backend's
// fault).
var signErrorKinds = []string{string(signer.KindUnavailable), string(signer.KindRefused), string(signer.KindInternal), "canceled"}

// istioSignErrors are the error label values of citadel_server_csr_sign_err_count.
var istioSignErrors = []string{signErrNotReady, signErrCSR, signErrTTL, signErrCertGen, signErrUnknown}

// latencyBuckets span 0.5 ms to 16 s, past which the request timeout
// looms.
var latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 16)

// NewMetrics creates the collectors and registers them with reg.
func NewMetrics(reg prometheus.Registerer, exp ExpirySource, now func() time.Time) *Metrics {
	if now == nil {
		now = time.Now
	}
	m := &Metrics{
		csrCount: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "citadel_server_csr_count", Help: "CreateCertificate requests received.",
		}),
		authnFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "citadel_server_authentication_failure_count", Help: "Requests that failed authentication.",
		}),
		issued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "citadel_server_success_cert_issuance_count", Help: "Certificates issued.",
		}),
		signErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "citadel_server_csr_sign_err_count", Help: "Signing failures by Istio error class.",
		}, []string{"error"}),
		// Istio declares these two and its CreateCertificate never moves
		// them; meshca counts what their help texts describe.
		csrParseErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "citadel_server_csr_parsing_err_count",
			Help: "CSRs refused because they do not parse (csr_malformed, csr_too_large).",
		}),
		idErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "citadel_server_id_extraction_err_count",
			Help: "CSRs refused because no identity can be extracted from them: no URI subjectAltName.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshca_requests_total", Help: "CreateCertificate outcomes by gRPC code and precise reason.",
		}, []string{"code", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "meshca_request_duration_seconds", Help: "CreateCertificate latency by gRPC code.",
			Buckets: latencyBuckets,
		}, []string{"code"}),
		signDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "meshca_sign_duration_seconds", Help: "Signer backend latency, answers and errors alike, by backend.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}, []string{"backend"}),
		backendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshca_sign_errors_total",
			Help: "Signer backend errors by backend and kind (unavailable: retry; refused: the backend's configuration; internal; canceled: the client gave up).",
		}, []string{"backend", "kind"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshca_rate_limited_total",
			Help: "Requests refused with ResourceExhausted by reason (too_many_requests: --max-in-flight; too_many_authentications: --max-authn-per-peer; " +
				"peer_authn_failures: --authn-failure-rate-per-peer; caller_rate, caller_in_flight: --caller-*; node_proxy_rate, node_proxy_in_flight: --node-proxy-*; " +
				"node_pod_lookups: a node's share (5/s, burst 20) of the apiserver lookups of Pods the index does not hold).",
		}, []string{"reason"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshca_requests_in_flight", Help: "CreateCertificate requests being served.",
		}),
		grpc: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(latencyBuckets))),
	}
	secs := func(f func() time.Time) func() float64 {
		return func() float64 { return f().Sub(now()).Seconds() }
	}
	stamp := func(f func() time.Time) func() float64 {
		return func() float64 { return float64(f().Unix()) }
	}
	m.rootExpiry = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "citadel_server_root_cert_expiry_timestamp", Help: "Unix time the earliest trusted root expires.",
	}, stamp(exp.RootNotAfter))
	m.rootExpirySecs = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "citadel_server_root_cert_expiry_seconds", Help: "Seconds until the earliest trusted root expires.",
	}, secs(exp.RootNotAfter))
	m.chainExpiry = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "citadel_server_cert_chain_expiry_timestamp", Help: "Unix time the signing chain expires.",
	}, stamp(exp.ChainNotAfter))
	m.chainExpirySec = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "citadel_server_cert_chain_expiry_seconds", Help: "Seconds until the signing chain expires.",
	}, secs(exp.ChainNotAfter))
	for _, e := range istioSignErrors {
		m.signErrors.WithLabelValues(e)
	}
	for _, r := range limit.Reasons {
		m.rateLimited.WithLabelValues(r)
	}
	reg.MustRegister(m.csrCount, m.authnFailures, m.issued, m.signErrors, m.csrParseErrors, m.idErrors, m.requests, m.duration,
		m.signDuration, m.backendErrors, m.rateLimited, m.inFlight, m.grpc,
		m.rootExpiry, m.rootExpirySecs, m.chainExpiry, m.chainExpirySec)
	return m
}

func (m *Metrics) observe(o Outcome, elapsed time.Duration) {
	code := o.Code.String()
	m.requests.WithLabelValues(code, o.Reason).Inc()
	m.duration.WithLabelValues(code).Observe(elapsed.Seconds())
	switch o.Code {
	case codes.OK:
		m.issued.Inc()
	case codes.Unauthenticated:
		m.authnFailures.Inc()
	case codes.ResourceExhausted:
		m.rateLimited.WithLabelValues(o.Reason).Inc()
	}
	if o.SignErr != "" {
		m.signErrors.WithLabelValues(o.SignErr).Inc()
	}
	switch {
	case o.ParseErr:
		m.csrParseErrors.Inc()
	case o.IDErr:
		m.idErrors.Inc()
	}
}

// initBackend makes the series of backend exist, at zero, before its
// first answer.
func (m *Metrics) initBackend(backend string) {
	m.signDuration.WithLabelValues(backend)
	for _, k := range signErrorKinds {
		m.backendErrors.WithLabelValues(backend, k)
	}
}

// ObserveSign implements signer.Observer: the backend's latency, and its
// error by kind.
func (m *Metrics) ObserveSign(backend string, took time.Duration, err error) {
	m.signDuration.WithLabelValues(backend).Observe(took.Seconds())
	if err == nil {
		return
	}
	kind := string(signer.KindOf(err))
	if errors.Is(err, context.Canceled) {
		kind = "canceled"
	}
	m.backendErrors.WithLabelValues(backend, kind).Inc()
}
