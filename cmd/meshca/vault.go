package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/signer/vault"
	"github.com/spf13/pflag"
)

// envVaultSecretID may carry the AppRole secret id instead of a file.
const envVaultSecretID = "MESHCA_VAULT_SECRET_ID"

const defaultSATokenPath = "/var/run/secrets/kubernetes.io/serviceaccount/token"

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
	fl.DurationVar(&v.reloginBackoff, "vault-relogin-backoff", vault.DefaultReloginBackoff, "least time between two logins forced by Vault refusing to sign (403); refusals in between fail without a login; 0 means the default")
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
	fl.StringVar(&v.k8sTokenFile, "vault-kubernetes-token-file", defaultSATokenPath, "service-account token for the Kubernetes auth method")
	fl.StringVar(&v.k8sMount, "vault-kubernetes-mount", "", "Kubernetes auth mount path (default kubernetes)")
}

func (b *backendFlags) validateVault() error {
	v := b.vault
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
	if b.servingCert == "" || b.servingKey == "" {
		return fmt.Errorf("%s and %s are required with the vault signer: meshca holds no CA key to issue its own", name("serving-cert-file"), name("serving-key-file"))
	}
	return nil
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
		auth = vault.TokenFile{Path: v.tokenFile}
	case v.approleRoleID != "":
		env := ""
		if v.approleSecretIDFile == "" {
			env = envVaultSecretID
		}
		auth, err = vault.AppRole(v.approleMount, v.approleRoleID, v.approleSecretIDFile, env)
	default:
		auth, err = vault.Kubernetes(v.k8sMount, v.k8sRole, v.k8sTokenFile)
	}
	if err != nil {
		return nil, fmt.Errorf("vault login: %w", err)
	}
	return auth, nil
}

// vaultConfig is the Vault backend's configuration from the flags.
func (b *backendFlags) vaultConfig(log *slog.Logger) (vault.Config, error) {
	v := b.vault
	auth, err := v.auth()
	if err != nil {
		return vault.Config{}, err
	}
	return vault.Config{
		Address: v.addr, CACertFile: v.caFile, Mount: v.mount, Role: v.role, KeyEnciphermentRole: v.rsaRole, DNSRole: v.istiodRole,
		Auth: auth, ReloginBackoff: v.reloginBackoff,
		OnLoginError: func(err error) { log.Warn("vault login or renewal failed", logError, err) },
	}, nil
}
