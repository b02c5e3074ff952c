package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer/local"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type serveFlags struct {
	log            logFlags
	listen         string
	adminListen    string
	stateDir       string
	caDir          string
	rootKeyType    string
	trustDomain    string
	clusterID      string
	kubeconfig     string
	audiences      []string
	servingNames   []string
	defaultTTL     time.Duration
	maxTTL         time.Duration
	keyPolicy      string
	maxInFlight    int
	requestTimeout time.Duration
}

func newServeCommand() *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the Istio CA API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context())
		},
	}
	fl := cmd.Flags()
	f.log.register(cmd)
	fl.StringVar(&f.listen, "listen", ":15012", "gRPC (TLS) listen address")
	fl.StringVar(&f.adminListen, "admin-listen", ":15014", "HTTP listen address for /metrics, /healthz and /readyz; empty disables it")
	fl.StringVar(&f.stateDir, "state-dir", "", "directory holding the self-signed CA; a root is generated there on first start")
	fl.StringVar(&f.caDir, "ca-dir", "", "directory holding a plugged-in CA in Istio's cacerts layout (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem) or tls.crt/tls.key/ca.crt")
	fl.StringVar(&f.rootKeyType, "root-key-type", string(keymgr.KeyECP256), fmt.Sprintf("key type of a generated root: %v", keymgr.KeyTypes))
	fl.StringVar(&f.trustDomain, "trust-domain", "cluster.local", "SPIFFE trust domain")
	fl.StringVar(&f.clusterID, "cluster-id", ca.DefaultClusterID, "name of the local cluster, matched against the clusterid header")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty uses the in-cluster configuration")
	fl.StringSliceVar(&f.audiences, "token-audiences", []string{ca.DefaultAudience}, "audiences a service-account token must carry (one of)")
	fl.StringSliceVar(&f.servingNames, "serving-dns-names", []string{"istiod.istio-system.svc", "meshca.istio-system.svc", "localhost"}, "DNS names (or IPs) in the serving certificate")
	fl.DurationVar(&f.defaultTTL, "default-ttl", ca.DefaultTTL, "certificate lifetime when the client asks for none")
	fl.DurationVar(&f.maxTTL, "max-ttl", ca.DefaultMaxTTL, "longest lifetime a client may ask for; longer requests are refused")
	fl.StringVar(&f.keyPolicy, "key-policy", "ecdsa-p256,ecdsa-p384,ed25519,rsa-2048-8192", "workload key algorithms and sizes allowed")
	fl.IntVar(&f.maxInFlight, "max-in-flight", ca.DefaultMaxInFlight, "requests served at once; more get ResourceExhausted")
	fl.DurationVar(&f.requestTimeout, "request-timeout", ca.DefaultRequestTimeout, "deadline of a request whose client set none")
	return cmd
}

// validate checks the flags that do not need I/O.
func (f *serveFlags) validate() (spiffeid.TrustDomain, csr.KeyPolicy, error) {
	var kp csr.KeyPolicy
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	switch {
	case err != nil:
		return td, kp, fmt.Errorf("--trust-domain: %w", err)
	case (f.stateDir == "") == (f.caDir == ""):
		return td, kp, errors.New("give exactly one of --state-dir (self-signed CA) and --ca-dir (plugged-in CA)")
	case f.defaultTTL <= 0 || f.maxTTL <= 0:
		return td, kp, errors.New("--default-ttl and --max-ttl must be positive")
	case f.defaultTTL > f.maxTTL:
		return td, kp, fmt.Errorf("--default-ttl %v is above --max-ttl %v", f.defaultTTL, f.maxTTL)
	case len(f.audiences) == 0:
		return td, kp, errors.New("--token-audiences must name at least one audience")
	case len(f.servingNames) == 0:
		return td, kp, errors.New("--serving-dns-names must name at least one DNS name")
	}
	if kp, err = csr.ParseKeyPolicy(f.keyPolicy); err != nil {
		return td, kp, fmt.Errorf("--key-policy: %w", err)
	}
	return td, kp, nil
}

func (f *serveFlags) loadAuthority(log *slog.Logger, td spiffeid.TrustDomain) (*keymgr.Authority, error) {
	if f.caDir != "" {
		a, err := keymgr.LoadCACerts(f.caDir, time.Now())
		if err != nil {
			return nil, fmt.Errorf("--ca-dir: %w", err)
		}
		log.Info("loaded plugged-in CA", "dir", f.caDir, "subject", a.Cert.Subject.String(), "not_after", a.NotAfter())
		return a, nil
	}
	a, created, err := keymgr.LoadOrCreate(f.stateDir, keymgr.StateOptions{KeyType: keymgr.KeyType(f.rootKeyType), Organization: td.Name()})
	if err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	log.Info("self-signed CA ready", "dir", f.stateDir, "created", created, "subject", a.Cert.Subject.String(), "not_after", a.Cert.NotAfter)
	return a, nil
}

func (f *serveFlags) run(ctx context.Context) error {
	log, err := f.log.logger()
	if err != nil {
		return err
	}
	td, keyPolicy, err := f.validate()
	if err != nil {
		return err
	}
	authority, err := f.loadAuthority(log, td)
	if err != nil {
		return err
	}
	kcfg, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	kcfg.QPS, kcfg.Burst = 200, 400
	kube, err := kubernetes.NewForConfig(kcfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	mgr := keymgr.NewManager(td, authority)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := ca.New(ca.Config{
		TrustDomain: td,
		ClusterID:   f.clusterID,
		Authenticators: []ca.Authenticator{
			&ca.CertAuthenticator{TrustDomain: td, Bundles: mgr},
			&ca.TokenReviewer{TrustDomain: td, Client: kube, Audiences: f.audiences},
		},
		Signer:         local.New(local.Config{Authorities: mgr}),
		SignerName:     "local",
		Bundles:        mgr,
		Policy:         csr.Policy{Keys: keyPolicy},
		DefaultTTL:     f.defaultTTL,
		MaxTTL:         f.maxTTL,
		MaxInFlight:    f.maxInFlight,
		RequestTimeout: f.requestTimeout,
		Metrics:        ca.NewMetrics(reg, mgr, nil),
		Logger:         log,
	})
	if err != nil {
		return err
	}
	serving, err := keymgr.NewServingRotator(mgr, keymgr.ServingOptions{Names: f.servingNames}, nil)
	if err != nil {
		return err
	}
	grpcSrv := ca.NewGRPCServer(srv, ca.TLSConfig(serving.GetCertificate, td, mgr))
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	g, ctx := errgroup.WithContext(ctx)
	attrs := []any{"grpc", lis.Addr().String(), "trust_domain", td.Name(), "cluster_id", f.clusterID, "signer", "local"}
	if f.adminListen != "" {
		alis, err := net.Listen("tcp", f.adminListen)
		if err != nil {
			lis.Close()
			return fmt.Errorf("--admin-listen: %w", err)
		}
		admin := &http.Server{Handler: ca.AdminHandler(reg, func() error { return nil }), ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := admin.Serve(alis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return admin.Shutdown(sctx)
		})
		attrs = append(attrs, "admin", alis.Addr().String())
	}
	g.Go(func() error { return grpcSrv.Serve(lis) })
	g.Go(func() error {
		serving.Run(ctx, func(err error) { log.Error("serving certificate renewal failed", "error", err) })
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		stopped := make(chan struct{})
		go func() { grpcSrv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			grpcSrv.Stop()
		}
		return nil
	})
	log.Info("serving", append(attrs, "serving_names", strings.Join(f.servingNames, ","))...)
	err = g.Wait()
	log.Info("stopped")
	return err
}
