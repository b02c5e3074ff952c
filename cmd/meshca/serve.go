package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/addrfile"
	"github.com/meshca/meshca/keymgr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/klog/v2"
)

type serveFlags struct {
	log            logFlags
	listen         string
	adminListen    string
	stateDir       string
	stateSecret    string
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
	certSigners    []string
	renewalTTL     time.Duration
	negativeTTL    time.Duration
	configFile     string
	addressFile    string
	publishTrust   bool
	trustSelector  string
	trustSkip      []string
	trustLeaseNS   string
	ctb            ctbFlags
	podCert        podCertFlags
	istiod         istiodFlags
	limits         limitFlags
	autoRotate     bool
	prepareAt      float64
	autoInterval   time.Duration
	rotationMargin time.Duration
	rootLifetime   time.Duration
	backdate       time.Duration
	b              backendFlags
	bundle         bundleEndpointFlags
	audit          auditFlags
	enablePprof    bool
	memoryLimit    memoryLimitFlag
	// settings says where each flag got its value (resolveSettings).
	settings *settings
}

func newServeCommand() *cobra.Command {
	cmd, _ := newServe()
	return cmd
}

// newServe is the serve command and the flags it fills.
func newServe() (*cobra.Command, *serveFlags) {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the Istio CA API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := resolveSettings(cmd.Flags(), os.Environ())
			if err != nil {
				return err
			}
			f.settings = s
			return f.run(cmd.Context(), cmd.Flags(), cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	f.log.register(cmd)
	f.b.register(fl)
	f.bundle.register(fl)
	f.audit.register(fl, "standard output")
	fl.StringVar(&f.configFile, "config", "", "YAML file of settings, one key per flag in camelCase and the backends' in sections (docs/signers/); below the command line, above MESHCA_* and Istio's variables (docs/istio.md); or set "+envName("config"))
	fl.StringVar(&f.listen, "listen", ":15012", "gRPC (TLS) listen address")
	fl.StringVar(&f.addressFile, "address-file", "", "write the bound gRPC and admin addresses here as JSON once listening (useful with port 0)")
	fl.StringVar(&f.adminListen, "admin-listen", ":15014", "HTTP listen address for /metrics, /healthz and /readyz; empty disables it")
	fl.BoolVar(&f.enablePprof, "enable-pprof", false, "serve Go's CPU, heap and allocation profiles under /debug/pprof/ on --admin-listen (for performance work; they expose internals)")
	fl.StringVar(&f.stateDir, "state-dir", "", "directory holding the CA state; a root is generated there on first start, and `meshca root` rotates it")
	fl.StringVar(&f.stateSecret, "state-secret", "", "the CA state in a Secret of the local cluster, namespace/name, instead of --state-dir")
	fl.StringVar(&f.caDir, "ca-dir", "", "directory holding a plugged-in CA in Istio's cacerts layout (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem) or tls.crt/tls.key/ca.crt")
	fl.BoolVar(&f.publishTrust, "publish-root-cert-configmaps", false, "publish the trust bundle as the istio-ca-root-cert ConfigMap in every namespace, as istiod does (leave off while istiod still runs its CA); one replica writes, elected on the Lease "+serve.TrustLease)
	fl.StringVar(&f.trustSelector, "trust-namespace-selector", "", "label selector of the namespaces the trust bundle is published to; empty: all")
	fl.StringSliceVar(&f.trustSkip, "trust-skip-namespaces", nil, "namespaces never published to, besides kube-public and kube-node-lease (kube-system is published to, for a ztunnel there)")
	fl.StringVar(&f.trustLeaseNS, "trust-lease-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the trust publisher's Lease")
	f.ctb.register(fl)
	f.podCert.register(fl)
	f.istiod.register(fl)
	f.limits.register(fl)
	f.memoryLimit.register(fl)
	fl.BoolVar(&f.autoRotate, "auto-rotate", true, "rotate roots meshca generated on its own: prepare the next when --auto-rotate-prepare-at of the active root's life is left, activate and retire as soon as the guards allow (imported roots are left to meshca root)")
	fl.Float64Var(&f.prepareAt, "auto-rotate-prepare-at", keymgr.DefaultPrepareAt, "fraction of the active root's lifetime left when automatic rotation prepares the next root")
	fl.DurationVar(&f.autoInterval, "auto-rotate-interval", keymgr.DefaultAutoRotateInterval, "how often automatic rotation looks for a step that is due (1s to 1h)")
	fl.DurationVar(&f.rotationMargin, "rotation-margin", keymgr.DefaultGuardMargin, "margin the guards of automatic rotation add: to half the longest leaf lifetime before activation, to the last leaf's expiry before retirement")
	fl.DurationVar(&f.rootLifetime, "root-lifetime", keymgr.DefaultRootTTL, "lifetime of a root meshca generates")
	fl.StringVar(&f.rootKeyType, "root-key-type", string(keymgr.KeyECP256), fmt.Sprintf("key type of a generated root: %v", keymgr.KeyTypes))
	fl.StringVar(&f.trustDomain, "trust-domain", ca.DefaultTrustDomain, "SPIFFE trust domain")
	fl.StringVar(&f.clusterID, "cluster-id", ca.DefaultClusterID, "name of the local cluster, matched against the clusterid header")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty uses the in-cluster configuration")
	fl.StringSliceVar(&f.audiences, "token-audiences", []string{kube.DefaultAudience}, "audiences a service-account token must carry (one of)")
	fl.StringSliceVar(&f.servingNames, "serving-dns-names", []string{"istiod.istio-system.svc", "meshca.istio-system.svc", "localhost"}, "DNS names (or IPs) in the serving certificate")
	fl.DurationVar(&f.defaultTTL, "default-ttl", ca.DefaultTTL, "certificate lifetime when the client asks for none")
	fl.DurationVar(&f.backdate, "backdate", keymgr.Backdate, fmt.Sprintf("how far before now issued certificates start, to tolerate clock skew (0 to %v)", maxBackdate))
	fl.DurationVar(&f.maxTTL, "max-ttl", ca.DefaultMaxTTL, "longest lifetime a client may ask for; longer requests are refused")
	fl.StringVar(&f.keyPolicy, "key-policy", "ecdsa-p256,ecdsa-p384,ed25519,rsa-2048-8192", "workload key algorithms and sizes allowed")
	fl.IntVar(&f.maxInFlight, "max-in-flight", ca.DefaultMaxInFlight, "requests served at once; more get ResourceExhausted")
	fl.DurationVar(&f.requestTimeout, "request-timeout", ca.DefaultRequestTimeout, "longest a request runs, whatever deadline its client sends")
	fl.IntVar(&f.maxHeaderBytes, "max-header-bytes", ca.DefaultMaxHeaderBytes, "largest header list of a request (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE); larger ones are refused by the transport")
	fl.IntVar(&f.maxTokenBytes, "max-token-bytes", ca.DefaultMaxTokenBytes, "longest bearer token; longer ones are refused (Unauthenticated, token_too_large) without a TokenReview")
	fl.IntVar(&f.maxAuthnPeer, "max-authn-per-peer", ca.DefaultMaxAuthnPerPeer, "authentications one peer IP may have in progress; more wait their turn, before any issuance slot is taken")
	fl.BoolVar(&f.certRenewal, "cert-renewal", true, "let a workload renew with its still-valid SVID as client certificate, without a token")
	fl.DurationVar(&f.renewalTTL, "cert-renewal-max-ttl", 0, "longest certificate issued to a renewal by client certificate; 0 means --default-ttl")
	fl.StringSliceVar(&f.certSigners, "cert-signers", nil, "CertSigner names (a proxy's ISTIO_META_CERT_SIGNER) answered by this CA's one signer; a request naming another is refused (InvalidArgument, unknown_cert_signer); an empty CertSigner is always served")
	fl.StringSliceVar(&f.nodeAccounts, "trusted-node-accounts", []string{ca.DefaultNodeAccount}, "namespace/serviceaccount of node proxies that may request the identities of Pods on their node")
	fl.DurationVar(&f.cacheTTL, "token-cache-ttl", kube.DefaultTokenCacheTTL, "longest a positive TokenReview is reused (never past the token's expiry)")
	fl.IntVar(&f.cacheSize, "token-cache-size", kube.DefaultTokenCacheSize, "most TokenReview answers kept per cluster")
	fl.DurationVar(&f.negativeTTL, "token-cache-negative-ttl", kube.DefaultNegativeTTL, "how long a token TokenReview refused is refused again without a review")
	fl.StringArrayVar(&f.remotes, "remote-cluster", nil, "remote cluster as <cluster id>=<kubeconfig file>; repeatable")
	fl.StringVar(&f.secretNS, "remote-secret-namespace", os.Getenv("POD_NAMESPACE"),
		"namespace of the local cluster watched for Secrets labelled "+kube.RemoteSecretLabel+"=true, one kubeconfig per remote cluster id; empty disables")
	fl.StringSliceVar(&f.remoteAllow, kube.KubeconfigAllowFlag, nil, fmt.Sprintf("kubeconfig fields that remote-cluster Secrets may use, refused by default as they run a command or read a local file: %v (--remote-cluster files are trusted)", kube.KubeconfigFeatures))
	return cmd, f
}

// validate checks the flags without I/O and returns what they say, the
// backend's files still unread (load reads them).
func (f *serveFlags) validate() (serve.Config, error) {
	var c serve.Config
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	if err != nil {
		return c, fmt.Errorf("--trust-domain: %w", err)
	}
	f.b.hasState = f.stateDir != "" || f.stateSecret != ""
	if err := f.b.validate(); err != nil {
		return c, err
	}
	switch {
	case f.b.signer == signerLocal && count(f.stateDir != "", f.stateSecret != "", f.caDir != "") != 1:
		return c, errors.New("give exactly one of --state-dir or --state-secret (self-signed CA) and --ca-dir (plugged-in CA)")
	case f.b.signer != signerLocal && f.caDir != "":
		return c, fmt.Errorf("--ca-dir belongs to the local signer, not --signer %s", f.b.signer)
	case f.b.signer != signerLocal && count(f.stateDir != "", f.stateSecret != "", f.b.trustAnchors != "") != 1:
		return c, fmt.Errorf("--signer %s: give exactly one of --trust-anchors (a pinned bundle) and --state-dir or --state-secret (a CA state that `meshca root` rotates)", f.b.signer)
	case f.defaultTTL <= 0 || f.maxTTL <= 0:
		return c, errors.New("--default-ttl and --max-ttl must be positive")
	case f.defaultTTL > f.maxTTL:
		return c, fmt.Errorf("--default-ttl %v is above --max-ttl %v", f.defaultTTL, f.maxTTL)
	case len(f.audiences) == 0:
		return c, errors.New("--token-audiences must name at least one audience")
	case len(f.servingNames) == 0:
		return c, errors.New("--serving-dns-names must name at least one DNS name")
	case f.clusterID == "":
		return c, errors.New("--cluster-id must not be empty")
	case f.cacheTTL < 0 || f.cacheSize < 0 || f.negativeTTL < 0:
		return c, errors.New("--token-cache-ttl, --token-cache-size and --token-cache-negative-ttl must not be negative")
	case f.maxHeaderBytes < 4<<10 || f.maxTokenBytes < 1<<10 || f.maxTokenBytes >= f.maxHeaderBytes:
		return c, fmt.Errorf("--max-token-bytes (%d) must be at least 1024 and below --max-header-bytes (%d), itself at least 4096", f.maxTokenBytes, f.maxHeaderBytes)
	case f.maxAuthnPeer <= 0 || f.requestTimeout <= 0:
		return c, errors.New("--max-authn-per-peer and --request-timeout must be positive")
	case f.prepareAt <= 0 || f.prepareAt >= 1 || f.rotationMargin < 0 || f.rootLifetime <= f.maxTTL:
		return c, fmt.Errorf("--auto-rotate-prepare-at must be in (0, 1), --rotation-margin not negative, and --root-lifetime (%v) longer than --max-ttl (%v)", f.rootLifetime, f.maxTTL)
	case f.autoInterval < time.Second || f.autoInterval > time.Hour:
		return c, fmt.Errorf("--auto-rotate-interval %v must be between 1s and 1h", f.autoInterval)
	case f.backdate < 0 || f.backdate > maxBackdate:
		return c, fmt.Errorf("--backdate %v must be between 0 and %v", f.backdate, maxBackdate)
	case f.renewalTTL < 0 || f.renewalTTL > f.defaultTTL:
		return c, fmt.Errorf("--cert-renewal-max-ttl %v must be between 0 and --default-ttl %v", f.renewalTTL, f.defaultTTL)
	case slices.Contains(f.certSigners, ""):
		return c, errors.New("--cert-signers: a name is empty (an empty CertSigner is always served)")
	}
	podCert, err := f.podCert.config(&f.ctb)
	if err != nil {
		return c, err
	}
	istiod, err := f.istiod.config(f.maxTTL)
	if err != nil {
		return c, err
	}
	if podCert.SignerName != "" && f.ctb.signer == "" {
		// The Pods mount the trust bundle of their signer: published,
		// linked to the same name, also when --publish-cluster-trust-bundle
		// is given without a signer name.
		f.ctb.publish, f.ctb.signer = true, podCert.SignerName
	}
	if err := f.ctb.validate(td); err != nil {
		return c, err
	}
	limits, conn, err := f.limits.config()
	if err != nil {
		return c, err
	}
	accounts, err := ca.ParseNodeAccounts(f.nodeAccounts)
	if err != nil {
		return c, fmt.Errorf("--trusted-node-accounts: %w", err)
	}
	remotes, err := parseRemotes(f.remotes, f.clusterID)
	if err != nil {
		return c, err
	}
	allow, err := kube.ParseKubeconfigAllow(f.remoteAllow)
	if err != nil {
		return c, fmt.Errorf("--%s: %w", kube.KubeconfigAllowFlag, err)
	}
	kp, err := csr.ParseKeyPolicy(f.keyPolicy)
	if err != nil {
		return c, fmt.Errorf("--key-policy: %w", err)
	}
	bundle, err := f.bundle.config(td, f.b.signer)
	if err != nil {
		return c, err
	}
	return serve.Config{
		TrustDomain: td, Listen: f.listen, AdminListen: f.adminListen, ServingNames: f.servingNames,
		DefaultTTL: f.defaultTTL, MaxTTL: f.maxTTL, CertRenewalTTL: f.renewalTTL, RequestTimeout: f.requestTimeout,
		MaxInFlight: f.maxInFlight, MaxAuthnPerPeer: f.maxAuthnPeer, MaxTokenBytes: f.maxTokenBytes, MaxHeaderBytes: f.maxHeaderBytes,
		Limits: limits, Conn: conn, KeyPolicy: kp, CertRenewal: f.certRenewal, CertSigners: f.certSigners,
		Clusters: serve.Clusters{
			LocalID: f.clusterID, LocalKubeconfig: f.kubeconfig, Remotes: remotes, SecretNamespace: f.secretNS, KubeconfigAllow: allow,
			Audiences: f.audiences, NodeAccounts: accounts, CacheTTL: f.cacheTTL, NegativeTTL: f.negativeTTL, CacheSize: f.cacheSize,
		},
		Trust: serve.Trust{Publish: f.publishTrust, Selector: f.trustSelector, Skip: f.trustSkip, LeaseNamespace: f.trustLeaseNS,
			ClusterTrustBundle: f.ctb.publish, ClusterTrustBundleSigner: f.ctb.signer},
		PodCertificates: podCert, IstiodCert: istiod, BundleEndpoint: bundle, EnablePprof: f.enablePprof,
		Backend: serve.Backend{
			Kind: f.b.signer, StateDir: f.stateDir, StateSecret: f.stateSecret, CADir: f.caDir,
			State:      keymgr.StateOptions{KeyType: keymgr.KeyType(f.rootKeyType), RootTTL: f.rootLifetime},
			AutoRotate: f.autoRotate, Rotation: keymgr.Guards{Margin: f.rotationMargin}, PrepareAt: f.prepareAt,
			AutoRotateInterval: f.autoInterval,
			Backdate:           backdateOption(f.backdate),
		},
	}, nil
}

// maxBackdate bounds --backdate: more would hide a broken clock rather
// than tolerate a skewed one.
const maxBackdate = 10 * time.Minute

// backdateOption is --backdate as keymgr.WindowOptions takes it, where
// zero means the default.
func backdateOption(d time.Duration) time.Duration {
	if d == 0 {
		return keymgr.NoBackdate
	}
	return d
}

// run validates the flags of fl, writes the configuration's audit event
// (to stdout unless --audit-log-file) and serves until ctx ends.
func (f *serveFlags) run(ctx context.Context, fl *pflag.FlagSet, stdout io.Writer) error {
	log, err := f.log.logger()
	if err != nil {
		return f.settings.explain(err)
	}
	klog.SetSlogLogger(log.With("part", "client-go"))
	c, err := f.validate()
	if err != nil {
		return f.settings.explain(err)
	}
	if err := f.memoryLimit.apply(log); err != nil {
		return f.settings.explain(err)
	}
	audit, file, err := f.audit.open(stdout)
	if err != nil {
		return err
	}
	if file != nil {
		defer file.Close()
		reopenOnHangup(ctx, file, log)
	}
	if f.settings != nil {
		audit.Audit(ctx, configEvent(fl, f.settings))
	}
	c.Logger, c.Audit = log, audit
	if err := f.b.load(&c.Backend, log); err != nil {
		return f.settings.explain(err)
	}
	parts, err := serve.Assemble(ctx, c)
	if err != nil {
		var fe *serve.FieldError
		if errors.As(err, &fe) {
			return f.settings.explain(fmt.Errorf("%s: %w", name(fe.Field), fe.Err))
		}
		return err
	}
	if f.addressFile != "" {
		if err := addrfile.Write(f.addressFile, parts.Addresses()); err != nil {
			return fmt.Errorf("--address-file: %w", err)
		}
	}
	return parts.Run(ctx)
}

// count is how many of set are true.
func count(set ...bool) int {
	n := 0
	for _, b := range set {
		if b {
			n++
		}
	}
	return n
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
