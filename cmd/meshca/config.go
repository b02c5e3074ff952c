package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// fileConfig is the --config file: the signer selection and one section
// per backend. Secrets are never values here: only paths of files holding
// them (or environment variables).
type fileConfig struct {
	Signer          string       `json:"signer"`
	TrustAnchors    string       `json:"trustAnchors"`
	ServingCertFile string       `json:"servingCertFile"`
	ServingKeyFile  string       `json:"servingKeyFile"`
	Cfssl           *cfsslConfig `json:"cfssl"`
	Vault           *vaultConfig `json:"vault"`
}

type vaultConfig struct {
	Addr                string `json:"addr"`
	CAFile              string `json:"caFile"`
	PKIMount            string `json:"pkiMount"`
	Role                string `json:"role"`
	RSARole             string `json:"rsaRole"`
	ReloginBackoff      string `json:"reloginBackoff"`
	TokenFile           string `json:"tokenFile"`
	AppRoleRoleID       string `json:"appRoleRoleID"`
	AppRoleSecretIDFile string `json:"appRoleSecretIDFile"`
	AppRoleMount        string `json:"appRoleMount"`
	KubernetesRole      string `json:"kubernetesRole"`
	KubernetesTokenFile string `json:"kubernetesTokenFile"`
	KubernetesMount     string `json:"kubernetesMount"`
}

type cfsslConfig struct {
	URL         string `json:"url"`
	Profile     string `json:"profile"`
	KEProfile   string `json:"keyEnciphermentProfile"`
	Label       string `json:"label"`
	AuthKeyFile string `json:"authKeyFile"`
	TLSCAFile   string `json:"tlsCAFile"`
	CACert      string `json:"caCert"`
	CAKey       string `json:"caKey"`
	Chain       string `json:"chain"`
	Config      string `json:"config"`
}

// field names a setting as a flag and as a config file key, for errors.
var field = map[string]string{
	"signer": "signer", "trust-anchors": "trustAnchors", "serving-cert-file": "servingCertFile", "serving-key-file": "servingKeyFile",
	"cfssl-url": "cfssl.url", "cfssl-profile": "cfssl.profile", "cfssl-key-encipherment-profile": "cfssl.keyEnciphermentProfile",
	"cfssl-label": "cfssl.label", "cfssl-auth-key-file": "cfssl.authKeyFile",
	"cfssl-tls-ca-file": "cfssl.tlsCAFile", "cfssl-ca-cert": "cfssl.caCert", "cfssl-ca-key": "cfssl.caKey", "cfssl-chain": "cfssl.chain",
	"cfssl-config": "cfssl.config",
	"vault-addr":   "vault.addr", "vault-ca-file": "vault.caFile", "vault-pki-mount": "vault.pkiMount", "vault-role": "vault.role",
	"vault-rsa-role": "vault.rsaRole", "vault-relogin-backoff": "vault.reloginBackoff",
	"vault-token-file": "vault.tokenFile", "vault-approle-role-id": "vault.appRoleRoleID", "vault-approle-secret-id-file": "vault.appRoleSecretIDFile",
	"vault-approle-mount": "vault.appRoleMount", "vault-kubernetes-role": "vault.kubernetesRole",
	"vault-kubernetes-token-file": "vault.kubernetesTokenFile", "vault-kubernetes-mount": "vault.kubernetesMount",
}

// loadConfigFile fills the backend settings from path; a flag given on the
// command line wins over the file. Unknown keys are errors.
func (b *backendFlags) loadConfigFile(path string, fl *pflag.FlagSet) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var c fileConfig
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	set := func(flag string, dst *string, v string) {
		if v != "" && !fl.Changed(flag) {
			*dst = v
		}
	}
	set("signer", &b.signer, c.Signer)
	set("trust-anchors", &b.trustAnchors, c.TrustAnchors)
	set("serving-cert-file", &b.servingCert, c.ServingCertFile)
	set("serving-key-file", &b.servingKey, c.ServingKeyFile)
	if s := c.Cfssl; s != nil {
		set("cfssl-url", &b.cfsslURL, s.URL)
		set("cfssl-profile", &b.cfsslProfile, s.Profile)
		set("cfssl-key-encipherment-profile", &b.cfsslKEProf, s.KEProfile)
		set("cfssl-label", &b.cfsslLabel, s.Label)
		set("cfssl-auth-key-file", &b.cfsslAuthFile, s.AuthKeyFile)
		set("cfssl-tls-ca-file", &b.cfsslTLSCA, s.TLSCAFile)
		set("cfssl-ca-cert", &b.cfsslCACert, s.CACert)
		set("cfssl-ca-key", &b.cfsslCAKey, s.CAKey)
		set("cfssl-chain", &b.cfsslChain, s.Chain)
		set("cfssl-config", &b.cfsslConfig, s.Config)
	}
	if v := c.Vault; v != nil {
		w := &b.vault
		set("vault-addr", &w.addr, v.Addr)
		set("vault-ca-file", &w.caFile, v.CAFile)
		set("vault-pki-mount", &w.mount, v.PKIMount)
		set("vault-role", &w.role, v.Role)
		set("vault-rsa-role", &w.rsaRole, v.RSARole)
		if v.ReloginBackoff != "" && !fl.Changed("vault-relogin-backoff") {
			d, err := time.ParseDuration(v.ReloginBackoff)
			if err != nil {
				return fmt.Errorf("--config %s: %s: %w", path, name("vault-relogin-backoff"), err)
			}
			w.reloginBackoff = d
		}
		set("vault-token-file", &w.tokenFile, v.TokenFile)
		set("vault-approle-role-id", &w.approleRoleID, v.AppRoleRoleID)
		set("vault-approle-secret-id-file", &w.approleSecretIDFile, v.AppRoleSecretIDFile)
		set("vault-approle-mount", &w.approleMount, v.AppRoleMount)
		set("vault-kubernetes-role", &w.k8sRole, v.KubernetesRole)
		set("vault-kubernetes-token-file", &w.k8sTokenFile, v.KubernetesTokenFile)
		set("vault-kubernetes-mount", &w.k8sMount, v.KubernetesMount)
	}
	return nil
}

// name renders a setting for an error: "--cfssl-url (cfssl.url)".
func name(flag string) string {
	if k, ok := field[flag]; ok {
		return "--" + flag + " (" + k + ")"
	}
	return "--" + flag
}
