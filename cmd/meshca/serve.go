package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/keymgr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
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
	nodeAccounts   []string
	cacheTTL       time.Duration
	cacheSize      int
	remotes        []string
	secretNS       string
	remoteAllow    []string
	maxHeaderBytes int
	maxTokenBytes  int
	maxAuthnPeer   int
	certRenewal    bool
	renewalTTL     time.Duration
	negativeTTL    time.Duration
	configFile     string
	b              backendFlags
}

func newServeCommand() *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the Istio CA API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.configFile != "" {
				if err := f.b.loadConfigFile(f.configFile, cmd.Flags()); err != nil {
					return err
				}
			}
			return f.run(cmd.Context())
		},
	}
	fl := cmd.Flags()
	f.log.register(cmd)
	f.b.register(fl)
	fl.StringVar(&f.configFile, "config", "", "YAML file with the signer selection and one section per backend (docs/signers/); flags given on the command line win")
	fl.StringVar(&f.listen, "listen", ":15012", "gRPC (TLS) listen address")
	fl.StringVar(&f.adminListen, "admin-listen", ":15014", "HTTP listen address for /metrics, /healthz and /readyz; empty disables it")
	fl.StringVar(&f.stateDir, "state-dir", "", "directory holding the self-signed CA; a root is generated there on first start")
	fl.StringVar(&f.caDir, "ca-dir", "", "directory holding a plugged-in CA in Istio's cacerts layout (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem) or tls.crt/tls.key/ca.crt")
	fl.StringVar(&f.rootKeyType, "root-key-type", string(keymgr.KeyECP256), fmt.Sprintf("key type of a generated root: %v", keymgr.KeyTypes))
	fl.StringVar(&f.trustDomain, "trust-domain", ca.DefaultTrustDomain, "SPIFFE trust domain")
	fl.StringVar(&f.clusterID, "cluster-id", ca.DefaultClusterID, "name of the local cluster, matched against the clusterid header")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty uses the in-cluster configuration")
	fl.StringSliceVar(&f.audiences, "token-audiences", []string{kube.DefaultAudience}, "audiences a service-account token must carry (one of)")
	fl.StringSliceVar(&f.servingNames, "serving-dns-names", []string{"istiod.istio-system.svc", "meshca.istio-system.svc", "localhost"}, "DNS names (or IPs) in the serving certificate")
	fl.DurationVar(&f.defaultTTL, "default-ttl", ca.DefaultTTL, "certificate lifetime when the client asks for none")
	fl.DurationVar(&f.maxTTL, "max-ttl", ca.DefaultMaxTTL, "longest lifetime a client may ask for; longer requests are refused")
	fl.StringVar(&f.keyPolicy, "key-policy", "ecdsa-p256,ecdsa-p384,ed25519,rsa-2048-8192", "workload key algorithms and sizes allowed")
	fl.IntVar(&f.maxInFlight, "max-in-flight", ca.DefaultMaxInFlight, "requests served at once; more get ResourceExhausted")
	fl.DurationVar(&f.requestTimeout, "request-timeout", ca.DefaultRequestTimeout, "longest a request runs, whatever deadline its client sends")
	fl.IntVar(&f.maxHeaderBytes, "max-header-bytes", ca.DefaultMaxHeaderBytes, "largest header list of a request (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE); larger ones are refused by the transport")
	fl.IntVar(&f.maxTokenBytes, "max-token-bytes", ca.DefaultMaxTokenBytes, "longest bearer token; longer ones are refused (Unauthenticated, token_too_large) without a TokenReview")
	fl.IntVar(&f.maxAuthnPeer, "max-authn-per-peer", ca.DefaultMaxAuthnPerPeer, "authentications one peer IP may have in progress; more wait their turn, before any issuance slot is taken")
	fl.BoolVar(&f.certRenewal, "cert-renewal", true, "let a workload renew with its still-valid SVID as client certificate, without a token")
	fl.DurationVar(&f.renewalTTL, "cert-renewal-max-ttl", 0, "longest certificate issued to a renewal by client certificate; 0 means --default-ttl")
	fl.StringSliceVar(&f.nodeAccounts, "trusted-node-accounts", []string{ca.DefaultNodeAccount}, "namespace/serviceaccount of node proxies that may request the identities of Pods on their node")
	fl.DurationVar(&f.cacheTTL, "token-cache-ttl", kube.DefaultTokenCacheTTL, "longest a positive TokenReview is reused (never past the token's expiry)")
	fl.IntVar(&f.cacheSize, "token-cache-size", kube.DefaultTokenCacheSize, "most TokenReview answers kept per cluster")
	fl.DurationVar(&f.negativeTTL, "token-cache-negative-ttl", kube.DefaultNegativeTTL, "how long a token TokenReview refused is refused again without a review")
	fl.StringArrayVar(&f.remotes, "remote-cluster", nil, "remote cluster as <cluster id>=<kubeconfig file>; repeatable")
	fl.StringVar(&f.secretNS, "remote-secret-namespace", os.Getenv("POD_NAMESPACE"),
		"namespace of the local cluster watched for Secrets labelled "+kube.RemoteSecretLabel+"=true, one kubeconfig per remote cluster id; empty disables")
	fl.StringSliceVar(&f.remoteAllow, kube.KubeconfigAllowFlag, nil, fmt.Sprintf("kubeconfig fields that remote-cluster Secrets may use, refused by default as they run a command or read a local file: %v (--remote-cluster files are trusted)", kube.KubeconfigFeatures))
	return cmd
}

// validate checks the flags that do not need I/O.
func (f *serveFlags) validate() (spiffeid.TrustDomain, csr.KeyPolicy, error) {
	var kp csr.KeyPolicy
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	if err != nil {
		return td, kp, fmt.Errorf("--trust-domain: %w", err)
	}
	if err := f.b.validate(); err != nil {
		return td, kp, err
	}
	switch {
	case f.b.signer == signerLocal && (f.stateDir == "") == (f.caDir == ""):
		return td, kp, errors.New("give exactly one of --state-dir (self-signed CA) and --ca-dir (plugged-in CA)")
	case f.b.signer != signerLocal && (f.stateDir != "" || f.caDir != ""):
		return td, kp, fmt.Errorf("--state-dir and --ca-dir belong to the local signer, not --signer %s", f.b.signer)
	case f.defaultTTL <= 0 || f.maxTTL <= 0:
		return td, kp, errors.New("--default-ttl and --max-ttl must be positive")
	case f.defaultTTL > f.maxTTL:
		return td, kp, fmt.Errorf("--default-ttl %v is above --max-ttl %v", f.defaultTTL, f.maxTTL)
	case len(f.audiences) == 0:
		return td, kp, errors.New("--token-audiences must name at least one audience")
	case len(f.servingNames) == 0:
		return td, kp, errors.New("--serving-dns-names must name at least one DNS name")
	case f.clusterID == "":
		return td, kp, errors.New("--cluster-id must not be empty")
	case f.cacheTTL < 0 || f.cacheSize < 0 || f.negativeTTL < 0:
		return td, kp, errors.New("--token-cache-ttl, --token-cache-size and --token-cache-negative-ttl must not be negative")
	case f.maxHeaderBytes < 4<<10 || f.maxTokenBytes < 1<<10 || f.maxTokenBytes >= f.maxHeaderBytes:
		return td, kp, fmt.Errorf("--max-token-bytes (%d) must be at least 1024 and below --max-header-bytes (%d), itself at least 4096", f.maxTokenBytes, f.maxHeaderBytes)
	case f.maxAuthnPeer <= 0 || f.requestTimeout <= 0:
		return td, kp, errors.New("--max-authn-per-peer and --request-timeout must be positive")
	case f.renewalTTL < 0 || f.renewalTTL > f.defaultTTL:
		return td, kp, fmt.Errorf("--cert-renewal-max-ttl %v must be between 0 and --default-ttl %v", f.renewalTTL, f.defaultTTL)
	}
	if _, err := ca.ParseNodeAccounts(f.nodeAccounts); err != nil {
		return td, kp, fmt.Errorf("--trusted-node-accounts: %w", err)
	}
	if _, err := parseRemotes(f.remotes, f.clusterID); err != nil {
		return td, kp, err
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
	be, err := f.backend(log, td)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	clusters, registry, secrets, err := f.clusters(td, reg, log)
	if err != nil {
		return err
	}
	srv, err := ca.New(ca.Config{
		TrustDomain:     td,
		Authenticators:  f.authenticators(td, be.bundles),
		Clusters:        registry,
		Signer:          be.signer,
		SignerName:      be.name,
		Bundles:         be.bundles,
		Policy:          csr.Policy{Keys: keyPolicy},
		DefaultTTL:      f.defaultTTL,
		MaxTTL:          f.maxTTL,
		MaxInFlight:     f.maxInFlight,
		RequestTimeout:  f.requestTimeout,
		MaxAuthnPerPeer: f.maxAuthnPeer,
		MaxTokenBytes:   f.maxTokenBytes,
		MaxHeaderBytes:  f.maxHeaderBytes,
		CertRenewalTTL:  f.renewalTTL,
		Metrics:         ca.NewMetrics(reg, be.expiry, nil),
		Logger:          log,
	})
	if err != nil {
		return err
	}
	grpcSrv := ca.NewGRPCServer(srv, ca.TLSConfig(be.getCert, td, be.bundles))
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	g, ctx := errgroup.WithContext(ctx)
	attrs := []any{"grpc", lis.Addr().String(), "trust_domain", td.Name(), "clusters", strings.Join(registry.IDs(), ","), "signer", be.name}
	if f.adminListen != "" {
		alis, err := net.Listen("tcp", f.adminListen)
		if err != nil {
			lis.Close()
			return fmt.Errorf("--admin-listen: %w", err)
		}
		admin := &http.Server{Handler: ca.AdminHandler(reg, registry.Ready), ReadHeaderTimeout: 5 * time.Second}
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
	for _, c := range clusters {
		g.Go(func() error { return c.Run(ctx) })
	}
	if secrets != nil {
		g.Go(func() error { return secrets.Run(ctx) })
	}
	g.Go(func() error { return grpcSrv.Serve(lis) })
	if be.runSigner != nil {
		g.Go(func() error { return be.runSigner(ctx) })
	}
	if be.run != nil {
		g.Go(func() error {
			be.run(ctx, func(err error) { log.Error("serving certificate renewal failed", "error", err) })
			return nil
		})
	}
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

// authenticators are the cluster-independent authenticators: the client
// certificate of a renewal, unless --cert-renewal=false.
func (f *serveFlags) authenticators(td spiffeid.TrustDomain, bundles x509bundle.Source) []ca.Authenticator {
	if !f.certRenewal {
		return nil
	}
	return []ca.Authenticator{&ca.CertAuthenticator{TrustDomain: td, Bundles: bundles}}
}

// parseRemotes reads --remote-cluster values, id=kubeconfig.
func parseRemotes(values []string, local string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range values {
		id, path, ok := strings.Cut(v, "=")
		switch {
		case !ok || id == "" || path == "":
			return nil, fmt.Errorf("--remote-cluster %q: want <cluster id>=<kubeconfig file>", v)
		case id == local:
			return nil, fmt.Errorf("--remote-cluster %q: %q is the local cluster's id", v, id)
		case out[id] != "":
			return nil, fmt.Errorf("--remote-cluster: cluster %q given twice", id)
		}
		out[id] = path
	}
	return out, nil
}

// kubeCluster builds one cluster from its client configuration.
func (f *serveFlags) kubeCluster(td spiffeid.TrustDomain, metrics *kube.TokenCacheMetrics, id string, kcfg *rest.Config) (*ca.KubeCluster, error) {
	accounts, _ := ca.ParseNodeAccounts(f.nodeAccounts)
	kcfg.QPS, kcfg.Burst = 200, 400
	kc, err := kubernetes.NewForConfig(kcfg)
	if err != nil {
		return nil, fmt.Errorf("cluster %s: kubernetes client: %w", id, err)
	}
	return ca.NewKubeCluster(ca.KubeClusterConfig{
		ID: id, Client: kc, TrustDomain: td, Audiences: f.audiences, TrustedNodeAccounts: accounts,
		CacheTTL: f.cacheTTL, CacheSize: f.cacheSize, NegativeTTL: f.negativeTTL, CacheMetrics: metrics,
	})
}

// clusters builds the local cluster (first) and the remote ones given by
// flags, and the watcher of remote-cluster Secrets (nil when disabled).
func (f *serveFlags) clusters(td spiffeid.TrustDomain, reg prometheus.Registerer, log *slog.Logger) ([]*ca.KubeCluster, *ca.ClusterSet, *kube.RemoteSecrets, error) {
	metrics := kube.NewTokenCacheMetrics(reg)
	fromFile := func(id, kubeconfig string) (*ca.KubeCluster, error) {
		kcfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: kubernetes client configuration: %w", id, err)
		}
		return f.kubeCluster(td, metrics, id, kcfg)
	}
	local, err := fromFile(f.clusterID, f.kubeconfig)
	if err != nil {
		return nil, nil, nil, err
	}
	out := []*ca.KubeCluster{local}
	registry := ca.NewClusterSet(local.Cluster)
	remotes, _ := parseRemotes(f.remotes, f.clusterID)
	ids := make([]string, 0, len(remotes))
	for id := range remotes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		c, err := fromFile(id, remotes[id])
		if err != nil {
			return nil, nil, nil, err
		}
		out = append(out, c)
		registry.Set(c.Cluster, nil)
	}
	allow, err := kube.ParseKubeconfigAllow(f.remoteAllow)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--%s: %w", kube.KubeconfigAllowFlag, err)
	}
	if f.secretNS == "" {
		return out, registry, nil, nil
	}
	remote := &ca.RemoteClusters{Set: registry, Logger: log, Build: func(id string, kcfg *rest.Config) (*ca.KubeCluster, error) {
		return f.kubeCluster(td, metrics, id, kcfg)
	}}
	secrets := kube.NewRemoteSecrets(kube.RemoteSecretsConfig{
		Client: local.Client, Namespace: f.secretNS, Clusters: remote, Logger: log,
		Allow: allow, Metrics: kube.NewRemoteSecretsMetrics(reg),
	})
	return out, registry, secrets, nil
}
