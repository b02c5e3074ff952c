// Package serve assembles `meshca serve`: from a validated Config it
// builds the signing backend, the clusters, the CA server and its
// listeners, and runs them. cmd/meshca turns flags into a Config and
// nothing else; everything that decides how the parts fit is here, where
// a test reaches it without a process.
package serve

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/leader/leaderprom"
	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/ca/trust/bundleendpoint"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/addrfile"
	"github.com/meshca/meshca/keymgr/keymgrprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
)

// Config is a validated serve configuration. Zero limits take ca's
// defaults.
type Config struct {
	TrustDomain spiffeid.TrustDomain
	// Listen is the gRPC (TLS) address; AdminListen serves /metrics,
	// /healthz and /readyz, and is off when empty. Port 0 lets the kernel
	// pick: Parts.Addresses reports what was bound.
	Listen, AdminListen string
	// ServingNames are the DNS names (or IPs) of a serving certificate
	// meshca issues itself.
	ServingNames []string
	// Limits and lifetimes of the CA server (see ca.Config).
	DefaultTTL, MaxTTL, CertRenewalTTL time.Duration
	RequestTimeout                     time.Duration
	MaxInFlight, MaxAuthnPerPeer       int
	MaxTokenBytes, MaxHeaderBytes      int
	// Limits are the budgets per caller and per peer, Conn the limits of
	// the gRPC server's connections.
	Limits    limit.Limits
	Conn      limit.ConnLimits
	KeyPolicy csr.KeyPolicy
	// CertRenewal lets a workload renew with its still-valid SVID.
	CertRenewal bool
	// CertSigners are the CertSigner names of istio-agent's requests the
	// backend answers for (ca.Config.CertSigners).
	CertSigners []string
	Clusters    Clusters
	Backend     Backend
	Trust       Trust
	// PodCertificates signs PodCertificateRequests; off when its
	// SignerName is empty.
	PodCertificates PodCertificates
	// IstiodCert keeps istiod's serving certificate; off when its Secret
	// is empty.
	IstiodCert IstiodCert
	Logger     *slog.Logger
	// Audit receives one event per decision: every request and every
	// automatic rotation step. Nil writes them through Logger.
	Audit ca.AuditSink
	// BundleEndpoint serves the trust bundle for SPIFFE federation; off
	// when its Listen is empty.
	BundleEndpoint BundleEndpoint
	// EnablePprof serves Go's profiles under /debug/pprof/ on the admin
	// listener.
	EnablePprof bool
	// Admin bounds the admin listener's connections and requests; zero
	// fields take limit.HTTPLimits' defaults.
	Admin limit.HTTPLimits
}

// Parts is an assembled meshca: listeners bound, nothing running yet.
type Parts struct {
	log      *slog.Logger
	grpc     *grpc.Server
	health   *ca.Health
	lis      net.Listener
	admin    *http.Server
	adminLis net.Listener
	bundle   *bundleendpoint.Server
	runners  []func(context.Context) error
	summary  []any
}

// Assemble builds every part from c: it loads or generates the CA, builds
// the backend and the clusters, and binds the listeners; ctx bounds that
// work. It starts no goroutine; Run does.
func Assemble(ctx context.Context, c Config) (_ *Parts, err error) {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Audit == nil {
		c.Audit = ca.AuditLogger(c.Logger)
	}
	c.Backend.audit = c.Audit
	c.Backend.localKubeconfig = c.Clusters.LocalKubeconfig
	if err := c.PodCertificates.linkTrust(&c.Trust); err != nil {
		return nil, err
	}
	if err := c.IstiodCert.check(c.Backend); err != nil {
		return nil, err
	}
	if c.Backend.MaxTTL <= 0 {
		c.Backend.MaxTTL = cmp.Or(c.MaxTTL, ca.DefaultMaxTTL)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	bundlePlan, err := planBundleEndpoint(c.BundleEndpoint, c.TrustDomain, c.Backend.name())
	if err != nil {
		return nil, err
	}
	if c.Clusters.NodeProxyDeny, err = denyEndpointID(c.Clusters.NodeProxyDeny, bundlePlan); err != nil {
		return nil, err
	}
	leaders := leaderprom.New(reg)
	be, err := newBackend(ctx, c.Backend, c.TrustDomain, c.ServingNames, c.Clusters.stateSecret, reg, leaders, c.Logger)
	if err != nil {
		return nil, err
	}
	keymgrprom.ObserveServing(reg, be.servingLeaf)
	be.defaultTTL = cmp.Or(c.DefaultTTL, ca.DefaultTTL)
	cl, err := newClusters(c.Clusters, c.TrustDomain, reg, c.Logger)
	if err != nil {
		return nil, err
	}
	var auths []ca.Authenticator
	if c.CertRenewal {
		retired, _ := be.bundles.(ca.RetiredIssuers)
		auths = append(auths, &ca.CertAuthenticator{TrustDomain: c.TrustDomain, Bundles: be.bundles, Retired: retired, Revoked: be})
	}
	srv, err := ca.New(ca.Config{
		TrustDomain: c.TrustDomain, Authenticators: auths, Clusters: cl.set,
		Signer: be.signer, SignerName: be.name, Bundles: be.bundles, Policy: csr.Policy{Keys: c.KeyPolicy},
		DefaultTTL: c.DefaultTTL, MaxTTL: c.MaxTTL, CertRenewalTTL: c.CertRenewalTTL,
		MaxInFlight: c.MaxInFlight, MaxAuthnPerPeer: c.MaxAuthnPerPeer, RequestTimeout: c.RequestTimeout,
		MaxTokenBytes: c.MaxTokenBytes, MaxHeaderBytes: c.MaxHeaderBytes, Limits: c.Limits, Conn: c.Conn, CertSigners: c.CertSigners,
		Metrics: ca.NewMetrics(reg, be.expiry, nil), Logger: c.Logger, Audit: c.Audit, NodeBlocks: be,
	})
	if err != nil {
		return nil, err
	}
	// The guard admits the gRPC listener's connections (ConnLimits' caps
	// and deadlines) and, as a stats handler, follows their RPCs.
	guard := limit.NewConnGuard(limit.ConnGuardConfig{Limits: c.Conn, Registerer: reg, Logger: c.Logger})
	p := &Parts{log: c.Logger, grpc: ca.NewGRPCServer(srv, ca.TLSConfig(be.getCert, c.TrustDomain, be.bundles),
		append(grpcOptions(), ca.GuardOptions(guard)...)...)}
	// gRPC probes of the CA's port see the readiness /readyz reports.
	ready := readiness(cl, be)
	if c.IstiodCert.Secret != "" {
		run, check, err := newIstiodRunner(c.IstiodCert, c.TrustDomain, cl.localClient, be, srv, c.Trust.LeaseNamespace, reg, leaders, c.Logger)
		if err != nil {
			return nil, err
		}
		p.runners, ready = append(p.runners, run), append(ready, check)
	}
	p.health = ca.RegisterHealth(p.grpc, ready.Ready)
	p.runners = append(p.runners, p.health.Run)
	if p.lis, err = net.Listen("tcp", c.Listen); err != nil {
		return nil, &FieldError{Field: "listen", Err: err}
	}
	p.lis = guard.Listener(p.lis)
	httpConns := limit.NewHTTPConnMetrics(reg)
	if c.AdminListen != "" {
		if p.adminLis, err = net.Listen("tcp", c.AdminListen); err != nil {
			p.lis.Close()
			return nil, &FieldError{Field: "admin-listen", Err: err}
		}
		h := ca.AdminHandler(reg, ready)
		if c.EnablePprof {
			h = withPprof(h)
		}
		p.admin, p.adminLis = newAdmin(p.adminLis, h, c.Admin, httpConns, c.Logger)
	}
	if c.Trust.enabled() {
		run, changed, err := newTrustRunner(c.Trust, c.TrustDomain, cl.localClient, be, reg, leaders, c.Logger)
		if err != nil {
			p.closeListeners()
			return nil, err
		}
		be.onChange = append(be.onChange, changed)
		p.runners = append(p.runners, run)
	}
	if c.PodCertificates.SignerName != "" {
		run, err := newPodCertRunner(c.PodCertificates, c.Backend.External, c.TrustDomain, cl.localClient, srv,
			c.Trust.LeaseNamespace, reg, leaders, c.Logger)
		if err != nil {
			p.closeListeners()
			return nil, err
		}
		p.runners = append(p.runners, run)
	}
	if bundlePlan != nil {
		if err := p.addBundleEndpoint(bundlePlan, c.TrustDomain, be, c.Backend.Backdate, reg, httpConns, c.Logger); err != nil {
			p.closeListeners()
			return nil, err
		}
	}
	p.runners = append(append(p.runners, cl.runners...), be.runners...)
	a := p.Addresses()
	p.summary = []any{"grpc", a.GRPC, "admin", a.Admin, "trust_domain", c.TrustDomain.Name(),
		"clusters", strings.Join(cl.set.IDs(), ","), "signer", be.name, "serving_names", strings.Join(c.ServingNames, ","), "istiod_cert_secret", c.IstiodCert.Secret,
		"bundle_endpoint", a.BundleEndpoint}
	if be.renewer != nil {
		p.summary = append(p.summary, "upstream", be.renewer.Name)
	}
	return p, nil
}

// closeListeners closes what Assemble bound, when a later part fails.
func (p *Parts) closeListeners() {
	p.lis.Close()
	if p.adminLis != nil {
		p.adminLis.Close()
	}
}

// Addresses reports what the listeners bound.
func (p *Parts) Addresses() addrfile.Addresses {
	a := addrfile.Addresses{GRPC: p.lis.Addr().String()}
	if p.adminLis != nil {
		a.Admin = p.adminLis.Addr().String()
	}
	if p.bundle != nil {
		a.BundleEndpoint = p.bundle.Addr().String()
	}
	return a
}

// Run serves until ctx ends or a part fails, then stops every part: the
// gRPC server gracefully, within 10 s, its health NOT_SERVING from the
// start of the drain.
func (p *Parts) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, run := range p.runners {
		g.Go(func() error { return run(ctx) })
	}
	g.Go(func() error { return p.grpc.Serve(p.lis) })
	if p.admin != nil {
		g.Go(func() error {
			if err := p.admin.Serve(p.adminLis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	g.Go(func() error {
		<-ctx.Done()
		p.health.Shutdown()
		stopped := make(chan struct{})
		go func() { p.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			p.grpc.Stop()
		}
		if p.admin == nil {
			return nil
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return p.admin.Shutdown(sctx)
	})
	p.log.Info("serving", p.summary...)
	err := g.Wait()
	p.log.Info("stopped")
	return err
}

// FieldError is a setting that cannot be used; Field is its flag name.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return fmt.Sprintf("serve: %s: %v", e.Field, e.Err) }

func (e *FieldError) Unwrap() error { return e.Err }
