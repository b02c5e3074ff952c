package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// serveExamples are serve's examples, in its short help.
const serveExamples = `  # meshca's own CA, its state in a Secret, publishing the trust bundle as istiod does:
  meshca serve --state-secret istio-system/meshca-ca --publish-root-cert-configmaps
  # istiod's plugged-in CA (the cacerts Secret, mounted):
  meshca serve --ca-dir /etc/cacerts
  # every setting from a file (each flag is also a MESHCA_<FLAG> variable):
  meshca serve --config /etc/meshca/config.yaml`

// groups are serve's flags in the groups of its help; every flag is
// registered in one of them (registerGroups).
func (f *serveFlags) groups(cmd *cobra.Command) []flagGroup {
	const ca = 4 // "CA state and rotation"
	groups := []flagGroup{
		{"Listen and TLS", []string{"listen", "serving-dns-names", "serving-cert-file"}, f.registerListen},
		{"Authentication", []string{"token-audiences", "cert-renewal", "kubeconfig", "remote-cluster"}, f.registerAuthn},
		{"Node proxies", []string{"trusted-node-accounts", "node-proxy-deny"}, f.registerNodeProxies},
		{"Issued certificates", []string{"trust-domain", "default-ttl", "max-ttl", "key-policy"}, f.registerIssued},
		{"CA state and rotation", []string{"state-dir", "state-secret", "ca-dir", "signer", "auto-rotate"}, f.registerState},
		{"Limits", []string{"max-in-flight", "caller-rate", "max-connections", "memory-limit"}, f.registerLimits},
		{"Trust publishing", []string{"publish-root-cert-configmaps", "publish-crl", "publish-cluster-trust-bundle", "bundle-endpoint-listen"}, f.registerTrust},
		{"Pod certificates", []string{"pod-certificate-signer-name"}, f.podCert.register},
		{"istiod's certificate", []string{"istiod-cert-secret", "istiod-deployment"}, f.istiod.register},
		{"Observability", []string{"log-level", "audit-log-file", "admin-listen", "enable-pprof"}, func(fl *pflag.FlagSet) { f.registerObservability(cmd, fl) }},
		{"Config", []string{"config", "print-config"}, func(fl *pflag.FlagSet) {
			fl.StringVar(&f.configFile, "config", "", "YAML file of settings, one key per flag in camelCase and the backends' in sections (docs/signers/); below the command line, above MESHCA_* and Istio's variables (docs/istio.md); or set "+envName("config"))
			fl.BoolVar(&f.printConfig, "print-config", false, "print the settings serve would run with, as a config file that says where each came from (flag, config, env NAME, default), check them and exit without serving")
		}},
	}
	// Each signer backend's flags after the CA state's, then the
	// intermediate's upstream, and each upstream's own.
	up := flagGroup{"Intermediate and upstream", []string{"upstream", "intermediate-ttl"}, f.up.register}
	return slices.Concat(groups[:ca+1], f.b.groups(), []flagGroup{up}, f.up.groups(), groups[ca+1:])
}

func (f *serveFlags) registerListen(fl *pflag.FlagSet) {
	fl.StringVar(&f.listen, "listen", ":15012", "gRPC (TLS) listen address")
	fl.StringVar(&f.addressFile, "address-file", "", "write the bound gRPC and admin addresses here as JSON once listening (useful with port 0)")
	fl.StringSliceVar(&f.servingNames, "serving-dns-names", []string{"istiod.istio-system.svc", "meshca.istio-system.svc", "localhost"}, "DNS names (or IPs) in the serving certificate")
	f.b.registerServing(fl)
}

func (f *serveFlags) registerAuthn(fl *pflag.FlagSet) {
	fl.StringSliceVar(&f.audiences, "token-audiences", []string{kube.DefaultAudience}, "audiences a service-account token must carry (one of)")
	fl.BoolVar(&f.certRenewal, "cert-renewal", true, "let a workload renew with its still-valid SVID as client certificate, without a token")
	fl.DurationVar(&f.renewalTTL, "cert-renewal-max-ttl", 0, "longest certificate issued to a renewal by client certificate; 0 means --default-ttl")
	fl.DurationVar(&f.cacheTTL, "token-cache-ttl", kube.DefaultTokenCacheTTL, "longest a positive TokenReview is reused (never past the token's expiry)")
	fl.IntVar(&f.cacheSize, "token-cache-size", kube.DefaultTokenCacheSize, "most TokenReview answers kept per cluster")
	fl.DurationVar(&f.negativeTTL, "token-cache-negative-ttl", kube.DefaultNegativeTTL, "how long a token TokenReview refused is refused again without a review")
	fl.StringVar(&f.clusterID, "cluster-id", ca.DefaultClusterID, "name of the local cluster, matched against the clusterid header")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty uses the in-cluster configuration")
	fl.StringArrayVar(&f.remotes, "remote-cluster", nil, "remote cluster as <cluster id>=<kubeconfig file>; repeatable")
	fl.StringVar(&f.secretNS, "remote-secret-namespace", os.Getenv("POD_NAMESPACE"),
		"namespace of the local cluster watched for Secrets labelled "+kube.RemoteSecretLabel+"=true, one kubeconfig per remote cluster id; empty disables")
	fl.StringSliceVar(&f.remoteAllow, kube.KubeconfigAllowFlag, nil, fmt.Sprintf("kubeconfig fields that remote-cluster Secrets may use, refused by default as they run a command, read a local file, or let whoever answers at the server's address decide token reviews (insecure-skip-tls-verify; http, an http:// server that also sees every token in cleartext): %v (--remote-cluster files are trusted)", kube.KubeconfigFeatures))
}

func (f *serveFlags) registerNodeProxies(fl *pflag.FlagSet) {
	fl.StringSliceVar(&f.nodeAccounts, "trusted-node-accounts", []string{ca.DefaultNodeAccount}, "namespace/serviceaccount of node proxies that may request the identities of Pods on their node")
	fl.StringSliceVar(&f.nodeProxyDeny, "node-proxy-deny", ca.DefaultNodeProxyDeny(), "namespaces (ns), service accounts (ns/sa) and account prefixes (ns/prefix*: istiod-* is istiod of every revision) whose identities no node proxy may request, whatever runs on its node (PermissionDenied, impersonation_denied_identity): the control plane's; meshca's own account, that of its credentials, is denied besides, whatever this says; empty denies no other")
}

func (f *serveFlags) registerIssued(fl *pflag.FlagSet) {
	fl.StringVar(&f.trustDomain, "trust-domain", ca.DefaultTrustDomain, "SPIFFE trust domain")
	fl.DurationVar(&f.defaultTTL, "default-ttl", ca.DefaultTTL, "certificate lifetime when the client asks for none")
	fl.DurationVar(&f.maxTTL, "max-ttl", ca.DefaultMaxTTL, "longest lifetime a client may ask for; longer requests are refused")
	fl.DurationVar(&f.backdate, "backdate", certs.Backdate, fmt.Sprintf("how far before now issued certificates start, to tolerate clock skew (0 to %v)", maxBackdate))
	fl.StringVar(&f.keyPolicy, "key-policy", "ecdsa-p256,ecdsa-p384,ed25519,rsa-2048-8192", "workload key algorithms and sizes allowed")
	fl.StringSliceVar(&f.certSigners, "cert-signers", nil, "CertSigner names (a proxy's ISTIO_META_CERT_SIGNER) answered by this CA's one signer; a request naming another is refused (InvalidArgument, unknown_cert_signer); an empty CertSigner is always served")
}

func (f *serveFlags) registerState(fl *pflag.FlagSet) {
	fl.StringVar(&f.stateDir, "state-dir", "", "directory holding the CA state; a root is generated there on first start, and \"meshca root\" rotates it")
	fl.StringVar(&f.stateSecret, "state-secret", "", "the CA state in a Secret of the local cluster, namespace/name, instead of --state-dir")
	fl.StringVar(&f.caDir, "ca-dir", "", "directory holding a plugged-in CA in Istio's cacerts layout (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem) or tls.crt/tls.key/ca.crt")
	f.b.registerSigner(fl)
	fl.StringVar(&f.rootKeyType, "root-key-type", string(certs.KeyECP256), fmt.Sprintf("key type of a generated root: %v", certs.KeyTypes))
	fl.DurationVar(&f.rootLifetime, "root-lifetime", keymgr.DefaultRootTTL, "lifetime of a root meshca generates")
	fl.BoolVar(&f.autoRotate, "auto-rotate", true, "rotate roots meshca generated on its own: prepare the next when --auto-rotate-prepare-at of the active root's life is left, activate and retire as soon as the guards allow (imported roots are left to \"meshca root\")")
	fl.Float64Var(&f.prepareAt, "auto-rotate-prepare-at", keymgr.DefaultPrepareAt, "fraction of the active root's lifetime left when automatic rotation prepares the next root")
	fl.DurationVar(&f.autoInterval, "auto-rotate-interval", keymgr.DefaultAutoRotateInterval, "how often automatic rotation looks for a step that is due (1s to 1h)")
	fl.DurationVar(&f.rotationMargin, "rotation-margin", keymgr.DefaultGuardMargin, "margin the guards of automatic rotation add: to half the longest leaf lifetime before activation, to the last leaf's expiry before retirement")
	f.crl.register(fl)
}

func (f *serveFlags) registerLimits(fl *pflag.FlagSet) {
	fl.IntVar(&f.maxInFlight, "max-in-flight", ca.DefaultMaxInFlight, "requests served at once; more get ResourceExhausted")
	fl.DurationVar(&f.requestTimeout, "request-timeout", ca.DefaultRequestTimeout, "longest a request runs, whatever deadline its client sends")
	fl.IntVar(&f.maxHeaderBytes, "max-header-bytes", ca.DefaultMaxHeaderBytes, "largest header list of a request (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE); larger ones are refused by the transport")
	fl.IntVar(&f.maxTokenBytes, "max-token-bytes", ca.DefaultMaxTokenBytes, "longest bearer token; longer ones are refused (Unauthenticated, token_too_large) without a TokenReview")
	fl.IntVar(&f.maxAuthnPeer, "max-authn-per-peer", ca.DefaultMaxAuthnPerPeer, "authentications one peer IP may have in progress; more wait their turn, before any issuance slot is taken")
	f.limits.register(fl)
	f.memoryLimit.register(fl)
}

func (f *serveFlags) registerTrust(fl *pflag.FlagSet) {
	fl.BoolVar(&f.publishTrust, "publish-root-cert-configmaps", false, "publish the trust bundle as the istio-ca-root-cert ConfigMap in every namespace, as istiod does (leave off while istiod still runs its CA); one replica writes, elected on the Lease "+serve.TrustLease)
	fl.StringVar(&f.trustSelector, "trust-namespace-selector", "", "label selector of the namespaces the trust bundle is published to; empty: all")
	fl.StringSliceVar(&f.trustSkip, "trust-skip-namespaces", nil, "namespaces never published to, besides kube-public and kube-node-lease (kube-system is published to, for a ztunnel there)")
	fl.StringVar(&f.trustLeaseNS, "trust-lease-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the trust publisher's Lease")
	fl.BoolVar(&f.publishCRL, "publish-crl", false, "publish the CA state's revocation lists (with --signer vault: Vault's, read every 15s) as the istio-ca-crl ConfigMap (ca-crl.pem) in the namespaces the trust bundle goes to, which ztunnel and istio-agent enforce (leave off while istiod still runs its CA); nothing is written while there is no CRL; with the built-in CA it needs --crl; refused with cfssl and k8scsr")
	f.ctb.register(fl)
	f.bundle.register(fl)
}

func (f *serveFlags) registerObservability(cmd *cobra.Command, fl *pflag.FlagSet) {
	f.log.register(cmd)
	f.audit.register(fl, "standard output")
	fl.StringVar(&f.adminListen, "admin-listen", ":15014", "HTTP listen address for /metrics, /healthz and /readyz; empty disables it")
	f.admin.register(fl)
	fl.StringVar(&f.adminBind, "admin-bind-address", "", "the one IP address --admin-listen binds, in place of every interface (an IPv6 address without brackets; the chart's monitoring.bindPodIP passes the Pod's IP); --admin-listen then gives only the port")
	fl.BoolVar(&f.enablePprof, "enable-pprof", false, "serve Go's CPU, heap and allocation profiles under /debug/pprof/ on --admin-listen (for performance work; they expose internals)")
}
