package main

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream/vaultpki"
	"github.com/meshca/meshca/signer/vault"
	"github.com/meshca/meshca/vaultauth"
	"github.com/meshca/meshca/vaultauth/vaultauthprom"
	"github.com/spf13/pflag"
)

const signerVault = "vault"

func init() {
	registerSigner(&signerBackend{
		name: signerVault, usage: "vault (Vault's PKI secrets engine)",
		helpGroup: "Vault backend", keyFlags: []string{"vault-addr", "vault-role", "vault-kubernetes-role"},
		serve: func() serveOptions { return &vaultFlags{} },
		root:  func() rootOptions { return &vaultRootFlags{} }, rootUsage: "vault (issuers of its PKI mount)",
	})
}

// envVaultSecretID may carry the AppRole secret id instead of a file.
const envVaultSecretID = "MESHCA_VAULT_SECRET_ID"

const defaultSATokenPath = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// vaultFlags configure the Vault backend: its address, PKI mount and
// roles, and how meshca logs in.
type vaultFlags struct {
	addr, caFile, mount, role string
	rsaRole                   string
	istiodRole                string
	reloginBackoff            time.Duration
	tokenFile                 string
	approleRoleID             string
	approleSecretIDFile       string
	approleMount              string
	k8sRole, k8sTokenFile     string
	k8sMount                  string
}

// register registers every Vault flag of serve.
func (v *vaultFlags) register(fl *pflag.FlagSet) {
	v.registerLogin(fl)
	v.registerRoles(fl)
	fl.StringVar(&v.istiodRole, "vault-istiod-role", "", "PKI role for istiod's DNS certificate (--istiod-cert-secret): allowed_domains its names, allow_bare_domains, key_usage=DigitalSignature (docs/signers/vault.md)")
	fl.DurationVar(&v.reloginBackoff, "vault-relogin-backoff", vaultauth.DefaultReloginBackoff, "least time between two logins forced by Vault refusing to sign (403); refusals in between fail without a login; 0 means the default")
}

// registerRoles registers the PKI roles workload certificates are
// signed with.
func (v *vaultFlags) registerRoles(fl *pflag.FlagSet) {
	fl.StringVar(&v.role, "vault-role", "", "PKI role meshca signs with, key_usage=DigitalSignature (docs/signers/vault.md)")
	fl.StringVar(&v.rsaRole, "vault-rsa-role", "", "PKI role for RSA workload keys, key_usage=DigitalSignature,KeyEncipherment; without it RSA requests are refused")
}

// registerLogin registers Vault's address, PKI mount and login.
func (v *vaultFlags) registerLogin(fl *pflag.FlagSet) {
	fl.StringVar(&v.addr, "vault-addr", "", "Vault address, e.g. https://vault.vault.svc:8200")
	fl.StringVar(&v.caFile, "vault-ca-file", "", "PEM roots verifying Vault's own TLS certificate")
	fl.StringVar(&v.mount, "vault-pki-mount", "pki", "mount path of Vault's PKI secrets engine")
	fl.StringVar(&v.tokenFile, "vault-token-file", "", "log in with the Vault token in this file (re-read at every login)")
	fl.StringVar(&v.approleRoleID, "vault-approle-role-id", "", "log in with AppRole: the role id (not a secret)")
	fl.StringVar(&v.approleSecretIDFile, "vault-approle-secret-id-file", "", "AppRole secret id file (or set "+envVaultSecretID+")")
	fl.StringVar(&v.approleMount, "vault-approle-mount", "", "AppRole auth mount path (default approle)")
	fl.StringVar(&v.k8sRole, "vault-kubernetes-role", "", "log in with Vault's Kubernetes auth method as this role")
	fl.StringVar(&v.k8sTokenFile, "vault-kubernetes-token-file", defaultSATokenPath, "service-account token for the Kubernetes auth method (re-read at every login, as the kubelet rotates it)")
	fl.StringVar(&v.k8sMount, "vault-kubernetes-mount", "", "Kubernetes auth mount path (default kubernetes)")
}

func (v *vaultFlags) validate(b *backendFlags) error {
	switch {
	case b.trustAnchors == "" && !b.hasState:
		return fmt.Errorf("%s (or a CA state) is required with the vault signer: Vault answers with its issuing CA, never the roots workloads must trust", name("trust-anchors"))
	case v.addr == "":
		return fmt.Errorf("%s is required with the vault signer", name("vault-addr"))
	case v.role == "":
		return fmt.Errorf("%s is required with the vault signer", name("vault-role"))
	case v.istiodRole != "" && (v.istiodRole == v.role || v.istiodRole == v.rsaRole):
		return fmt.Errorf("%s names a workload role: istiod's DNS certificate needs a role of its own, which allows its names and no SPIFFE ID", name("vault-istiod-role"))
	case v.rsaRole != "" && v.rsaRole == v.role:
		return fmt.Errorf("%s names the same role as %s: a Vault role fixes its key usages, and RSA keys need key encipherment that other keys must not have", name("vault-rsa-role"), name("vault-role"))
	case v.reloginBackoff < 0:
		return fmt.Errorf("%s must not be negative", name("vault-relogin-backoff"))
	}
	if err := v.validateLogin(); err != nil {
		return err
	}
	return b.requireServing("vault")
}

func (v *vaultFlags) load(_ *backendFlags, c *serve.Backend, log *slog.Logger) error {
	vc, err := v.config(log)
	if err != nil {
		return err
	}
	c.External = &vaultExternal{c: vc}
	return nil
}

// vaultExternal is the Vault backend as serve opens it.
type vaultExternal struct{ c vault.Config }

func (v *vaultExternal) Name() string { return signerVault }

// Open builds the signer; its login loop is the probe, retrying until
// Vault answers, and tells the health and the login metrics.
func (v *vaultExternal) Open(_ context.Context, env serve.ExternalEnv) (*serve.Opened, error) {
	c := v.c
	c.Observer = vaultLogin{metrics: vaultauthprom.New(env.Registerer, nil), health: env.Health}
	report := c.OnLoginError
	c.OnLoginError = func(err error) {
		env.Health.Reason(err)
		if report != nil {
			report(err)
		}
	}
	s, err := vault.New(c)
	if err != nil {
		return nil, &serve.FieldError{Field: "vault-addr", Err: err}
	}
	return &serve.Opened{Signer: s, Remote: true, Runners: []func(context.Context) error{s.Run}}, nil
}

// IstiodCert asks for the role istiod's certificate is signed under.
func (v *vaultExternal) IstiodCert() error {
	if v.c.DNSRole != "" {
		return nil
	}
	return &serve.FieldError{Field: "vault-istiod-role", Err: errors.New("istiod's certificate (--istiod-cert-secret) needs a Vault role of its own " +
		"(docs/signers/vault.md, \"istiod's certificate\")")}
}

// PodCertificates: Vault signs them.
func (v *vaultExternal) PodCertificates() error { return nil }

// vaultLogin tells the login metrics and the backend's health of the
// Vault login (vaultauth.Observer).
type vaultLogin struct {
	metrics vaultauth.Observer
	health  serve.Health
}

func (o vaultLogin) LoggedIn(expires time.Time) {
	o.metrics.LoggedIn(expires)
	o.health.Worked()
}

func (o vaultLogin) LoggedOut() {
	o.metrics.LoggedOut()
	o.health.Failed(errors.New("no Vault token: the login failed or lapsed"))
}

// validateLogin checks the mount and that exactly one login is given.
func (v *vaultFlags) validateLogin() error {
	methods := 0
	for _, set := range []bool{v.tokenFile != "", v.approleRoleID != "", v.k8sRole != ""} {
		if set {
			methods++
		}
	}
	switch {
	case v.mount == "":
		return fmt.Errorf("%s must not be empty", name("vault-pki-mount"))
	case methods != 1:
		return fmt.Errorf("log in to Vault in one way: %s, %s or %s", name("vault-token-file"), name("vault-approle-role-id"), name("vault-kubernetes-role"))
	case v.approleRoleID == "" && v.approleSecretIDFile != "":
		return fmt.Errorf("%s needs %s", name("vault-approle-secret-id-file"), name("vault-approle-role-id"))
	case v.approleRoleID != "" && v.approleSecretIDFile == "" && os.Getenv(envVaultSecretID) == "":
		return fmt.Errorf("AppRole login needs %s or %s", name("vault-approle-secret-id-file"), envVaultSecretID)
	}
	return nil
}

// auth is the login method the flags give.
func (v *vaultFlags) auth() (api.AuthMethod, error) {
	var (
		auth api.AuthMethod
		err  error
	)
	switch {
	case v.tokenFile != "":
		auth = vaultauth.TokenFile{Path: v.tokenFile}
	case v.approleRoleID != "":
		env := ""
		if v.approleSecretIDFile == "" {
			env = envVaultSecretID
		}
		auth, err = vaultauth.AppRole(v.approleMount, v.approleRoleID, v.approleSecretIDFile, env)
	default:
		auth, err = vaultauth.Kubernetes(v.k8sMount, v.k8sRole, v.k8sTokenFile)
	}
	if err != nil {
		return nil, fmt.Errorf("vault login: %w", err)
	}
	return auth, nil
}

// config is the Vault backend's configuration from the flags.
func (v *vaultFlags) config(log *slog.Logger) (vault.Config, error) {
	login, err := v.loginConfig(log)
	if err != nil {
		return vault.Config{}, err
	}
	return vault.Config{
		Address: v.addr, CACertFile: v.caFile, Mount: v.mount, Role: v.role, KeyEnciphermentRole: v.rsaRole, DNSRole: v.istiodRole,
		Auth: login.Auth, ReloginBackoff: v.reloginBackoff, OnLoginError: login.OnLoginError,
	}, nil
}

// loginConfig is the Vault login the flags give: the signer's, and the
// Vault upstreams'.
func (v *vaultFlags) loginConfig(log *slog.Logger) (vaultauth.Config, error) {
	auth, err := v.auth()
	if err != nil {
		return vaultauth.Config{}, err
	}
	return vaultauth.Config{
		Address: v.addr, CACertFile: v.caFile, Auth: auth, ReloginBackoff: v.reloginBackoff,
		OnLoginError: func(err error) { log.Warn("vault login or renewal failed", logError, err) },
	}, nil
}

// vaultLoginOf reads the Vault flags (address, TLS roots, PKI mount,
// login, re-login backoff) as fl holds them, whoever registered them
// there: the Vault upstreams log in with the flags the Vault backend
// registers, in serve and in the root steps alike, rather than flags of
// their own that would mean the same.
func vaultLoginOf(fl *pflag.FlagSet) (*vaultFlags, error) {
	v := &vaultFlags{}
	mine := pflag.NewFlagSet("vault", pflag.ContinueOnError)
	v.registerLogin(mine)
	mine.DurationVar(&v.reloginBackoff, "vault-relogin-backoff", 0, "")
	var err error
	mine.VisitAll(func(f *pflag.Flag) {
		if src := fl.Lookup(f.Name); src != nil && err == nil {
			if serr := f.Value.Set(src.Value.String()); serr != nil {
				err = fmt.Errorf("%s: %w", name(f.Name), serr)
			}
		}
	})
	return v, err
}

// validateUpstream checks the flags a Vault upstream logs in with.
func (v *vaultFlags) validateUpstream(upstream string) error {
	switch {
	case v.addr == "":
		return fmt.Errorf("%s is required with --upstream %s", name("vault-addr"), upstream)
	case v.reloginBackoff < 0:
		return fmt.Errorf("%s must not be negative", name("vault-relogin-backoff"))
	}
	return v.validateLogin()
}

// Vault issuer kinds `meshca root prepare --signer vault` creates.
const (
	vaultIssuerRoot         = "root"
	vaultIssuerIntermediate = "intermediate"
)

// vaultRootFlags are the Vault flags of a rotation step: the login, and
// the issuers the step creates, switches to or deletes.
type vaultRootFlags struct {
	vault      vaultFlags
	issuerType string
	rootMount  string
	keepIssuer bool
}

func (r *vaultRootFlags) register(fl *pflag.FlagSet, step string) {
	r.vault.registerLogin(fl)
	r.issuerType = vaultIssuerRoot
	switch step {
	case "prepare":
		fl.StringVar(&r.issuerType, "vault-issuer-type", vaultIssuerRoot, "--signer vault: a new root issuer in --vault-pki-mount, or an intermediate there under a new root in --vault-root-mount")
		fl.StringVar(&r.rootMount, "vault-root-mount", "", "--signer vault: the PKI mount holding the roots of intermediate issuers")
	case "activate":
		r.vault.registerRoles(fl)
	case "retire":
		fl.StringVar(&r.rootMount, "vault-root-mount", "", "--signer vault: the PKI mount holding the roots of intermediate issuers")
		fl.BoolVar(&r.keepIssuer, "vault-keep-issuer", false, "--signer vault: keep the retired issuer and its key in Vault (default: delete them)")
	}
}

func (r *vaultRootFlags) open(ctx context.Context, out io.Writer) (rootBackend, error) {
	switch {
	case r.issuerType != vaultIssuerRoot && r.issuerType != vaultIssuerIntermediate:
		return nil, fmt.Errorf("--vault-issuer-type %q is not one of root, intermediate", r.issuerType)
	case r.issuerType == vaultIssuerIntermediate && (r.rootMount == "" || r.rootMount == r.vault.mount):
		return nil, errors.New("--vault-issuer-type intermediate needs --vault-root-mount, a PKI mount other than --vault-pki-mount, for the new root")
	case r.vault.addr == "":
		return nil, errors.New("--vault-addr is required with --signer vault")
	}
	if err := r.vault.validateLogin(); err != nil {
		return nil, err
	}
	auth, err := r.vault.auth()
	if err != nil {
		return nil, err
	}
	client, err := vaultauth.Login(ctx, vaultauth.Config{Address: r.vault.addr, CACertFile: r.vault.caFile, Auth: auth})
	if err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	return &vaultRoot{flags: r, issuers: vaultpki.NewIssuers(client, r.vault.mount), out: out}, nil
}

// vaultRoot drives the issuers of a Vault PKI mount.
type vaultRoot struct {
	flags   *vaultRootFlags
	issuers *vaultpki.Issuers
	out     io.Writer
}

func (v *vaultRoot) prepare(ctx context.Context, s *keymgr.State, f *prepareFlags) (*keymgr.AuthorityRecord, error) {
	if f.certFile != "" || f.caDir != "" || f.external {
		return nil, errors.New("--signer vault creates its issuer in Vault: import flags (--cert, --ca-dir, --external) do not apply")
	}
	org := f.organization(s)
	now := time.Now().UTC()
	// Vault refuses a name twice: the time, and a random tail for two
	// prepares in one second.
	stamp := now.Format("20060102T150405Z") + "-" + rand.Text()[:6]
	root := vaultpki.IssuerSpec{CommonName: "meshca root " + now.Format(time.RFC3339), Organization: org,
		KeyType: certs.KeyType(f.keyType), TTL: f.lifetime, Name: "meshca-root-" + stamp}
	if v.flags.issuerType == vaultIssuerRoot {
		cert, err := v.issuers.CreateRoot(ctx, root)
		if err != nil {
			return nil, err
		}
		return &keymgr.AuthorityRecord{Root: cert, Cert: cert, External: true}, nil
	}
	inter := vaultpki.IssuerSpec{CommonName: "meshca intermediate " + now.Format(time.RFC3339), Organization: org,
		KeyType: certs.KeyType(f.keyType), TTL: f.lifetime - time.Hour, Name: "meshca-intermediate-" + stamp}
	rootCert, cert, err := v.issuers.CreateIntermediate(ctx, v.flags.rootMount, root, inter)
	if err != nil {
		return nil, err
	}
	return &keymgr.AuthorityRecord{Root: rootCert, Cert: cert, External: true}, nil
}

func (v *vaultRoot) activate(ctx context.Context, _ *keymgr.State, rec *keymgr.AuthorityRecord) error {
	var roles []string
	for _, r := range []string{v.flags.vault.role, v.flags.vault.rsaRole} {
		if r != "" {
			roles = append(roles, r)
		}
	}
	return v.issuers.Activate(ctx, rec.Cert, roles)
}

func (v *vaultRoot) retire(ctx context.Context, s *keymgr.State, rec *keymgr.AuthorityRecord) error {
	if v.flags.keepIssuer {
		fmt.Fprintf(v.out, "kept in Vault: the issuers of %s (--vault-keep-issuer)\n", shortID(rec))
		return nil
	}
	var certs []*x509.Certificate
	for _, c := range append([]*x509.Certificate{rec.Cert, rec.Root}, rec.Chain...) {
		if by := s.View().InUseBy(rec, c); by != nil {
			fmt.Fprintf(v.out, "kept in Vault: %q and its key, which authority %s (%s) still uses\n", c.Subject, shortID(by), by.Phase)
			continue
		}
		certs = append(certs, c)
	}
	deleted, err := v.issuers.Delete(ctx, v.flags.rootMount, certs...)
	for _, d := range deleted {
		fmt.Fprintf(v.out, "deleted in Vault: %s and its key\n", d)
	}
	return err
}
