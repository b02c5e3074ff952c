package ca

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Metrics are the server's Prometheus collectors. Istio's citadel_* names
// are kept (without a _total suffix) because operators alert on them; the
// meshca_* series add the reason label that explains every refusal.
type Metrics struct {
	csrCount       prometheus.Counter
	authnFailures  prometheus.Counter
	issued         prometheus.Counter
	signErrors     *prometheus.CounterVec
	requests       *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	signDuration   *prometheus.HistogramVec
	inFlight       prometheus.Gauge
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
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshca_requests_total", Help: "CreateCertificate outcomes by gRPC code and precise reason.",
		}, []string{"code", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "meshca_request_duration_seconds", Help: "CreateCertificate latency by gRPC code.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"code"}),
		signDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "meshca_sign_duration_seconds", Help: "Signer backend latency.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}, []string{"backend"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshca_requests_in_flight", Help: "CreateCertificate requests being served.",
		}),
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
	reg.MustRegister(m.csrCount, m.authnFailures, m.issued, m.signErrors, m.requests, m.duration,
		m.signDuration, m.inFlight, m.rootExpiry, m.rootExpirySecs, m.chainExpiry, m.chainExpirySec)
	return m
}

func (m *Metrics) observe(o Outcome, elapsed time.Duration) {
	code := o.Code.String()
	m.requests.WithLabelValues(code, o.Reason).Inc()
	m.duration.WithLabelValues(code).Observe(elapsed.Seconds())
	switch {
	case o.Code == codes.OK:
		m.issued.Inc()
	case o.Code == codes.Unauthenticated:
		m.authnFailures.Inc()
	}
	if o.SignErr != "" {
		m.signErrors.WithLabelValues(o.SignErr).Inc()
	}
}
