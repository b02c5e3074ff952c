package serve

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/ca/trust/bundleendpoint"
	"github.com/meshca/meshca/keymgr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// BundleEndpoint configures the SPIFFE bundle endpoint: the trust bundle
// served over HTTPS as a SPIFFE bundle (a JWK Set), for a SPIRE server or
// another SPIFFE control plane to federate with meshca.
type BundleEndpoint struct {
	// Listen is the HTTPS address; the endpoint is off when empty. Port 0
	// lets the kernel pick: Parts.Addresses reports what was bound.
	Listen string
	// Profile is bundleendpoint.ProfileSPIFFE or ProfileWeb. Empty means
	// https_web when CertFile is set, https_spiffe otherwise.
	Profile string
	// ID is the endpoint's SPIFFE ID under https_spiffe, in the trust
	// domain: meshca's CA issues it an X509-SVID, renewed as the serving
	// certificate is (and at once when the CA state changes).
	ID spiffeid.ID
	// CertFile and KeyFile hold the operator's certificate chain and key
	// for https_web, read at start and again when they change.
	CertFile, KeyFile string
	// RefreshHint is the spiffe_refresh_hint advertised;
	// bundleendpoint.DefaultRefreshHint when zero.
	RefreshHint time.Duration
	// Limits bound the endpoint's connections and requests; zero fields
	// take limit.HTTPLimits' defaults.
	Limits limit.HTTPLimits
}

// bundlePlan is a BundleEndpoint checked before anything is built.
type bundlePlan struct {
	c       BundleEndpoint
	profile string
	keys    *bundleendpoint.KeyPair // https_web
}

// planBundleEndpoint checks c for a backend of kind in td, and reads the
// operator's certificate for https_web; nil when the endpoint is off.
func planBundleEndpoint(c BundleEndpoint, td spiffeid.TrustDomain, kind string) (*bundlePlan, error) {
	if c.Listen == "" {
		return nil, nil
	}
	p := &bundlePlan{c: c, profile: c.Profile}
	if p.profile == "" {
		p.profile = bundleendpoint.ProfileSPIFFE
		if c.CertFile != "" {
			p.profile = bundleendpoint.ProfileWeb
		}
	}
	switch p.profile {
	case bundleendpoint.ProfileSPIFFE:
		switch {
		case kind != BackendLocal:
			return nil, &FieldError{Field: "bundle-endpoint-profile", Err: fmt.Errorf(
				"https_spiffe presents an X509-SVID issued by meshca's own CA, and with the %s backend meshca holds no CA key: serve https_web with the operator's certificate and key", kind)}
		case c.CertFile != "" || c.KeyFile != "":
			return nil, &FieldError{Field: "bundle-endpoint-cert-file", Err: errors.New("the operator's certificate belongs to https_web; https_spiffe presents an SVID of meshca's CA")}
		case c.ID.IsZero():
			return nil, &FieldError{Field: "bundle-endpoint-spiffe-id", Err: errors.New("https_spiffe needs the endpoint's SPIFFE ID")}
		case !c.ID.MemberOf(td):
			return nil, &FieldError{Field: "bundle-endpoint-spiffe-id", Err: fmt.Errorf("%s is not in trust domain %s, whose CA issues the endpoint's SVID", c.ID, td.Name())}
		}
	case bundleendpoint.ProfileWeb:
		if c.CertFile == "" || c.KeyFile == "" {
			return nil, &FieldError{Field: "bundle-endpoint-cert-file", Err: errors.New("https_web needs the operator's certificate chain and key files")}
		}
		keys, err := bundleendpoint.LoadKeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, &FieldError{Field: "bundle-endpoint-cert-file", Err: err}
		}
		p.keys = keys
	default:
		return nil, &FieldError{Field: "bundle-endpoint-profile", Err: fmt.Errorf("%q: want %s or %s", p.profile, bundleendpoint.ProfileSPIFFE, bundleendpoint.ProfileWeb)}
	}
	return p, nil
}

// addBundleEndpoint builds the planned endpoint over the bundle be serves,
// binds its listener, and adds its loops to p's runners.
func (p *Parts) addBundleEndpoint(plan *bundlePlan, td spiffeid.TrustDomain, be *backend, backdate time.Duration,
	reg prometheus.Registerer, conns *limit.HTTPConnMetrics, log *slog.Logger) error {
	log = log.With("part", "bundle-endpoint")
	src := bundleendpoint.NewSource(td, be.bundles, plan.c.RefreshHint)
	src.Observe(be.sequence())
	be.onChange = append(be.onChange, func() { src.Observe(be.sequence()) })
	var getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	switch plan.profile {
	case bundleendpoint.ProfileSPIFFE:
		mgr, ok := be.bundles.(*keymgr.Manager)
		if !ok {
			return &FieldError{Field: "bundle-endpoint-profile", Err: fmt.Errorf("the %s backend holds no CA key to issue the endpoint's SVID", be.name)}
		}
		rot, err := keymgr.NewServingRotator(mgr, keymgr.ServingOptions{ID: plan.c.ID, Backdate: backdate}, nil)
		if err != nil {
			return &FieldError{Field: "bundle-endpoint-spiffe-id", Err: err}
		}
		rot.OnError = func(err error) { log.Error("bundle endpoint SVID renewal failed", "error", err) }
		be.onChange = append(be.onChange, func() {
			if err := rot.Renew(); err != nil {
				log.Error("bundle endpoint SVID renewal failed", "error", err)
			}
		})
		getCert = rot.GetCertificate
		p.runners = append(p.runners, rot.Run)
	case bundleendpoint.ProfileWeb:
		k := plan.keys
		k.OnReload = func(c *tls.Certificate) {
			log.Info("bundle endpoint certificate reloaded", "subject", c.Leaf.Subject.String(), "not_after", c.Leaf.NotAfter)
		}
		k.OnError = func(err error) { log.Error("bundle endpoint certificate not reloaded", "error", err) }
		getCert = k.GetCertificate
		p.runners = append(p.runners, k.Run)
	}
	counter, err := newBundleCounter(reg)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", plan.c.Listen)
	if err != nil {
		return &FieldError{Field: "bundle-endpoint-listen", Err: err}
	}
	srv, err := bundleendpoint.New(bundleendpoint.Config{Listener: lis, TrustDomain: td, Source: src,
		GetCertificate: getCert, Observer: counter, Logger: log, Limits: plan.c.Limits,
		Conns: limit.NewHTTPConns(limit.HTTPConnsConfig{Server: bundleServer, Limits: plan.c.Limits, Metrics: conns, Logger: log})})
	if err != nil {
		lis.Close()
		return err
	}
	p.bundle = srv
	p.runners = append(p.runners, srv.Run)
	return nil
}

// bundleCounter is meshca_bundle_endpoint_requests_total{result}.
type bundleCounter struct{ requests *prometheus.CounterVec }

func newBundleCounter(reg prometheus.Registerer) (*bundleCounter, error) {
	c := &bundleCounter{requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshca_bundle_endpoint_requests_total",
		Help: "Requests to the SPIFFE bundle endpoint by result (served, refused: not a GET, error: no bundle).",
	}, []string{"result"})}
	if err := reg.Register(c.requests); err != nil {
		return nil, fmt.Errorf("serve: bundle endpoint metrics: %w", err)
	}
	for _, r := range []string{bundleendpoint.ResultServed, bundleendpoint.ResultRefused, bundleendpoint.ResultError} {
		c.requests.WithLabelValues(r)
	}
	return c, nil
}

// ObserveRequest implements bundleendpoint.Observer.
func (c *bundleCounter) ObserveRequest(result string) { c.requests.WithLabelValues(result).Inc() }
