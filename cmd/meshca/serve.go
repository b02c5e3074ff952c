package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
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
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/klog/v2"
)

type serveFlags struct {
	log            logFlags
	listen         string
	adminListen    string
	adminBind      string
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
	nodeProxyDeny  []string
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
	printConfig    bool
	addressFile    string
	publishTrust   bool
	publishCRL     bool
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
	crl            crlFlags
	backdate       time.Duration
	b              backendFlags
	up             upstreamFlags
	bundle         bundleEndpointFlags
	audit          auditFlags
	enablePprof    bool
	admin          adminFlags
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
	var groups []flagGroup
	cmd := &cobra.Command{
		Use:     "serve",
		Short:   "Serve the Istio CA API",
		Example: serveExamples,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := resolveSettings(cmd.Flags(), os.Environ())
			if err != nil {
				return err
			}
			f.settings = s
			if f.printConfig {
				return f.print(cmd.Flags(), cmd.OutOrStdout(), groups)
			}
			return f.run(cmd.Context(), cmd.Flags(), cmd.OutOrStdout())
		},
	}
	groups = f.groups(cmd)
	registerGroups(cmd.Flags(), groups)
	setGroupedHelp(cmd, groups)
	return cmd, f
}

// validate checks the flags without I/O and returns what they say, the
// backend's files still unread (load reads them).
func (f *serveFlags) validate() (serve.Config, error) {
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	if err != nil {
		return serve.Config{}, fmt.Errorf("--trust-domain: %w", err)
	}
	f.b.hasState = f.stateDir != "" || f.stateSecret != ""
	if err := f.b.validate(); err != nil {
		return serve.Config{}, err
	}
	if err := f.up.validate(f.b.signer, f.b.hasState, f.defaultTTL); err != nil {
		return serve.Config{}, err
	}
	if err := f.crl.validate(f.b.signer, f.b.hasState, f.publishCRL, &f.up); err != nil {
		return serve.Config{}, err
	}
	if err := f.checkCA(); err != nil {
		return serve.Config{}, err
	}
	if err := f.checkRanges(); err != nil {
		return serve.Config{}, err
	}
	c := serve.Config{
		TrustDomain: td, Listen: f.listen, ServingNames: f.servingNames,
		DefaultTTL: f.defaultTTL, MaxTTL: f.maxTTL, CertRenewalTTL: f.renewalTTL, RequestTimeout: f.requestTimeout,
		MaxInFlight: f.maxInFlight, MaxAuthnPerPeer: f.maxAuthnPeer, MaxTokenBytes: f.maxTokenBytes, MaxHeaderBytes: f.maxHeaderBytes,
		CertRenewal: f.certRenewal, CertSigners: f.certSigners, EnablePprof: f.enablePprof,
		Backend: serve.Backend{
			StateDir: f.stateDir, StateSecret: f.stateSecret, CADir: f.caDir,
			State:      dirstore.StateOptions{KeyType: certs.KeyType(f.rootKeyType), RootTTL: f.rootLifetime},
			AutoRotate: f.autoRotate, Rotation: keymgr.Guards{Margin: f.rotationMargin}, PrepareAt: f.prepareAt,
			AutoRotateInterval: f.autoInterval, CRL: f.crl.config(),
			Backdate: backdateOption(f.backdate),
		},
	}
	if err := f.features(td, &c); err != nil {
		return serve.Config{}, err
	}
	if c.Clusters, err = f.clusters(); err != nil {
		return serve.Config{}, err
	}
	return c, nil
}

// checkCA checks that the flags name one source of the CA for the signer.
func (f *serveFlags) checkCA() error {
	states := count(f.stateDir != "", f.stateSecret != "")
	switch {
	case f.b.signer == signerLocal && states+count(f.caDir != "") != 1:
		return errors.New("give one CA: --state-dir or --state-secret (meshca's own state), or --ca-dir (a plugged-in CA)")
	case f.b.signer != signerLocal && f.caDir != "":
		return fmt.Errorf("--ca-dir belongs to the local signer, not --signer %s", f.b.signer)
	case f.b.signer != signerLocal && states+count(f.b.trustAnchors != "") != 1:
		return fmt.Errorf("--signer %s: give the roots workloads trust in one way: --trust-anchors (a pinned bundle), or --state-dir or --state-secret (a CA state that \"meshca root\" rotates)", f.b.signer)
	}
	return nil
}

// checkRanges checks the scalar settings' bounds and relations.
func (f *serveFlags) checkRanges() error {
	switch {
	case f.defaultTTL <= 0 || f.maxTTL <= 0:
		return errors.New("--default-ttl and --max-ttl must be positive")
	case f.defaultTTL > f.maxTTL:
		return fmt.Errorf("--default-ttl %v is above --max-ttl %v", f.defaultTTL, f.maxTTL)
	case len(f.audiences) == 0:
		return errors.New("--token-audiences must name at least one audience")
	case len(f.servingNames) == 0:
		return errors.New("--serving-dns-names must name at least one DNS name")
	case f.clusterID == "":
		return errors.New("--cluster-id must not be empty")
	case f.cacheTTL < 0 || f.cacheSize < 0 || f.negativeTTL < 0:
		return errors.New("--token-cache-ttl, --token-cache-size and --token-cache-negative-ttl must not be negative")
	case f.maxHeaderBytes < 4<<10 || f.maxTokenBytes < 1<<10 || f.maxTokenBytes >= f.maxHeaderBytes:
		return fmt.Errorf("--max-token-bytes (%d) must be at least 1024 and below --max-header-bytes (%d), itself at least 4096", f.maxTokenBytes, f.maxHeaderBytes)
	case f.maxAuthnPeer <= 0 || f.requestTimeout <= 0:
		return errors.New("--max-authn-per-peer and --request-timeout must be positive")
	case f.prepareAt <= 0 || f.prepareAt >= 1 || f.rotationMargin < 0 || f.rootLifetime <= f.maxTTL:
		return fmt.Errorf("--auto-rotate-prepare-at must be in (0, 1), --rotation-margin not negative, and --root-lifetime (%v) longer than --max-ttl (%v)", f.rootLifetime, f.maxTTL)
	case f.autoInterval < time.Second || f.autoInterval > time.Hour:
		return fmt.Errorf("--auto-rotate-interval %v must be between 1s and 1h", f.autoInterval)
	case f.backdate < 0 || f.backdate > maxBackdate:
		return fmt.Errorf("--backdate %v must be between 0 and %v", f.backdate, maxBackdate)
	case f.renewalTTL < 0 || f.renewalTTL > f.defaultTTL:
		return fmt.Errorf("--cert-renewal-max-ttl %v must be between 0 and --default-ttl %v", f.renewalTTL, f.defaultTTL)
	case slices.Contains(f.certSigners, ""):
		return errors.New("--cert-signers: a name is empty (an empty CertSigner is always served)")
	}
	return nil
}

// features fills c's parts beyond the request path: pod certificates,
// istiod's certificate, trust publishing, limits, the key policy, the
// bundle endpoint and the admin listener.
func (f *serveFlags) features(td spiffeid.TrustDomain, c *serve.Config) error {
	podCert, err := f.podCert.config(&f.ctb)
	if err != nil {
		return err
	}
	if c.IstiodCert, err = f.istiod.config(f.maxTTL, f.stateSecret); err != nil {
		return err
	}
	if podCert.SignerName != "" && f.ctb.signer == "" {
		// The Pods mount the trust bundle of their signer: published,
		// linked to the same name, also when --publish-cluster-trust-bundle
		// is given without a signer name.
		f.ctb.publish, f.ctb.signer = true, podCert.SignerName
	}
	if err := f.ctb.validate(td); err != nil {
		return err
	}
	c.PodCertificates = podCert
	c.Trust = serve.Trust{Publish: f.publishTrust, CRL: f.publishCRL, Selector: f.trustSelector, Skip: f.trustSkip, LeaseNamespace: f.trustLeaseNS,
		ClusterTrustBundle: f.ctb.publish, ClusterTrustBundleSigner: f.ctb.signer}
	if c.Limits, c.Conn, err = f.limits.config(); err != nil {
		return err
	}
	if c.KeyPolicy, err = csr.ParseKeyPolicy(f.keyPolicy); err != nil {
		return fmt.Errorf("--key-policy: %w", err)
	}
	if c.BundleEndpoint, err = f.bundle.config(td, f.b.signer); err != nil {
		return err
	}
	if c.Admin, err = f.admin.config(); err != nil {
		return err
	}
	c.AdminListen, err = adminAddress(f.adminListen, f.adminBind)
	return err
}

// clusters is the local cluster and the remote ones, and how their
// callers are authenticated and node proxies authorized.
func (f *serveFlags) clusters() (serve.Clusters, error) {
	accounts, err := ca.ParseNodeAccounts(f.nodeAccounts)
	if err != nil {
		return serve.Clusters{}, fmt.Errorf("--trusted-node-accounts: %w", err)
	}
	deny, err := ca.ParseNodeProxyDeny(f.nodeProxyDeny)
	if err != nil {
		return serve.Clusters{}, fmt.Errorf("--node-proxy-deny: %w", err)
	}
	remotes, err := parseRemotes(f.remotes, f.clusterID)
	if err != nil {
		return serve.Clusters{}, err
	}
	allow, err := kube.ParseKubeconfigAllow(f.remoteAllow)
	if err != nil {
		return serve.Clusters{}, fmt.Errorf("--%s: %w", kube.KubeconfigAllowFlag, err)
	}
	return serve.Clusters{
		LocalID: f.clusterID, LocalKubeconfig: f.kubeconfig, Remotes: remotes, SecretNamespace: f.secretNS, KubeconfigAllow: allow,
		Audiences: f.audiences, NodeAccounts: accounts, NodeProxyDeny: deny, CacheTTL: f.cacheTTL, NegativeTTL: f.negativeTTL, CacheSize: f.cacheSize,
	}, nil
}

// maxBackdate bounds --backdate: more would hide a broken clock rather
// than tolerate a skewed one.
const maxBackdate = 10 * time.Minute

// backdateOption is --backdate as certs.WindowOptions takes it, where
// zero means the default.
func backdateOption(d time.Duration) time.Duration {
	if d == 0 {
		return certs.NoBackdate
	}
	return d
}

// print writes the settings as --print-config shows them, then checks
// them as serve would before reading any file: a refusal is the error.
func (f *serveFlags) print(fl *pflag.FlagSet, w io.Writer, groups []flagGroup) error {
	if err := printConfig(w, fl, f.settings, groups); err != nil {
		return err
	}
	if _, err := f.log.logger(); err != nil {
		return f.settings.explain(err)
	}
	_, err := f.validate()
	return f.settings.explain(err)
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
	if c.Backend.Upstream, err = f.up.config(log); err != nil {
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

// adminAddress is the admin listener's address: listen, or, with bind,
// listen's port on that one IP address.
func adminAddress(listen, bind string) (string, error) {
	if bind == "" {
		return listen, nil
	}
	ip, err := netip.ParseAddr(bind)
	if err != nil || ip.Zone() != "" {
		return "", fmt.Errorf("--admin-bind-address %q is not an IP address", bind)
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil || host != "" {
		return "", fmt.Errorf("--admin-bind-address %s: --admin-listen %q must then be a port alone, \":<port>\"", bind, listen)
	}
	return net.JoinHostPort(ip.String(), port), nil
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
