package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"strings"

	cfconfig "github.com/cloudflare/cfssl/config"
	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer/cfssl"
	"github.com/spf13/pflag"
)

// Signer backends.
const (
	signerLocal  = serve.BackendLocal
	signerCfssl  = serve.BackendCfssl
	signerVault  = serve.BackendVault
	signerK8sCSR = serve.BackendK8sCSR
)

// envCfsslAuthKey may carry the cfssl auth key instead of a file.
const envCfsslAuthKey = "MESHCA_CFSSL_AUTH_KEY"

// backendFlags select and configure the signer.
type backendFlags struct {
	signer        string
	trustAnchors  string
	servingCert   string
	servingKey    string
	cfsslURL      string
	cfsslProfile  string
	cfsslKEProf   string
	cfsslIstiod   string
	cfsslLabel    string
	cfsslAuthFile string
	cfsslTLSCA    string
	cfsslCACert   string
	cfsslCAKey    string
	cfsslChain    string
	cfsslConfig   string
	vault         vaultFlags
	k8scsr        k8scsrFlags
	// hasState: the trust bundle comes from a CA state (--state-dir or
	// --state-secret), not from --trust-anchors.
	hasState bool
}

// registerSigner registers the choice of backend and the roots it needs.
func (b *backendFlags) registerSigner(fl *pflag.FlagSet) {
	fl.StringVar(&b.signer, "signer", signerLocal, "signing backend: local (built-in CA), cfssl, vault or k8scsr (Kubernetes CertificateSigningRequests)")
	fl.StringVar(&b.trustAnchors, "trust-anchors", "", "PEM roots workloads trust, pinned, for external backends; or give them a CA state (--state-dir, --state-secret) that \"meshca root\" rotates")
}

// registerServing registers the serving certificate of external backends.
func (b *backendFlags) registerServing(fl *pflag.FlagSet) {
	fl.StringVar(&b.servingCert, "serving-cert-file", "", "serving certificate chain (PEM) for external backends; must chain to --trust-anchors")
	fl.StringVar(&b.servingKey, "serving-key-file", "", "serving certificate key")
}

// registerCfssl registers the cfssl backend's flags; the Vault and
// k8scsr backends register their own.
func (b *backendFlags) registerCfssl(fl *pflag.FlagSet) {
	fl.StringVar(&b.cfsslURL, "cfssl-url", "", "remote cfssl server URL (cfssl serve or multirootca)")
	fl.StringVar(&b.cfsslProfile, "cfssl-profile", "", "cfssl signing profile; a remote profile grants exactly digital signature, server auth and client auth")
	fl.StringVar(&b.cfsslKEProf, "cfssl-key-encipherment-profile", "", "remote cfssl: profile for RSA workload keys, granting digital signature, key encipherment, server auth and client auth; without it --cfssl-profile serves RSA keys too")
	fl.StringVar(&b.cfsslIstiod, "cfssl-istiod-profile", "", "cfssl profile for istiod's DNS certificate (--istiod-cert-secret), granting digital signature, server auth and client auth to its names alone; in process without --cfssl-config: the default policy's \""+cfssl.DefaultIstiodProfile+"\"")
	fl.StringVar(&b.cfsslLabel, "cfssl-label", "", "cfssl signer label (multirootca)")
	fl.StringVar(&b.cfsslAuthFile, "cfssl-auth-key-file", "", "file holding the hex auth key for authsign (or set "+envCfsslAuthKey+")")
	fl.StringVar(&b.cfsslTLSCA, "cfssl-tls-ca-file", "", "PEM roots verifying an https cfssl server")
	fl.StringVar(&b.cfsslCACert, "cfssl-ca-cert", "", "in-process cfssl: signing CA certificate")
	fl.StringVar(&b.cfsslCAKey, "cfssl-ca-key", "", "in-process cfssl: signing CA key")
	fl.StringVar(&b.cfsslChain, "cfssl-chain", "", "certificates above the signing CA, without the root (PEM)")
	fl.StringVar(&b.cfsslConfig, "cfssl-config", "", "in-process cfssl: cfssl configuration file (its signing section)")
}

// validate checks the selection without I/O.
func (b *backendFlags) validate() error {
	switch b.signer {
	case signerLocal:
		return nil
	case signerCfssl:
	case signerVault:
		return b.validateVault()
	case signerK8sCSR:
		return b.validateK8sCSR()
	default:
		return fmt.Errorf("%s: %q is not one of local, cfssl, vault, k8scsr", name("signer"), b.signer)
	}
	inProcess := b.cfsslCACert != "" || b.cfsslCAKey != ""
	switch {
	case b.trustAnchors == "" && !b.hasState:
		return fmt.Errorf("%s (or a CA state) is required with the cfssl signer: the trust bundle is pinned, never learned from the backend", name("trust-anchors"))
	case inProcess == (b.cfsslURL != ""):
		return fmt.Errorf("cfssl signer: give either %s (remote) or %s and %s (in process)", name("cfssl-url"), name("cfssl-ca-cert"), name("cfssl-ca-key"))
	case inProcess && (b.cfsslCACert == "" || b.cfsslCAKey == ""):
		return fmt.Errorf("%s and %s go together", name("cfssl-ca-cert"), name("cfssl-ca-key"))
	case !inProcess && (b.servingCert == "" || b.servingKey == ""):
		return fmt.Errorf("%s and %s are required with a remote cfssl: meshca holds no CA key to issue its own", name("serving-cert-file"), name("serving-key-file"))
	case (b.servingCert == "") != (b.servingKey == ""):
		return fmt.Errorf("%s and %s go together", name("serving-cert-file"), name("serving-key-file"))
	case inProcess && (b.cfsslAuthFile != "" || b.cfsslTLSCA != ""):
		return fmt.Errorf("%s and %s apply to a remote cfssl only", name("cfssl-auth-key-file"), name("cfssl-tls-ca-file"))
	case inProcess && b.cfsslLabel != "":
		return fmt.Errorf("%s applies to a remote cfssl only", name("cfssl-label"))
	case inProcess && b.cfsslKEProf != "":
		return fmt.Errorf("%s applies to a remote cfssl only: in process, certificates carry the usages meshca derives from the key", name("cfssl-key-encipherment-profile"))
	case b.cfsslKEProf != "" && b.cfsslKEProf == b.cfsslProfile:
		return fmt.Errorf("%s names the same profile as %s: a remote cfssl takes a certificate's usages from its profile, and RSA keys need key encipherment that other keys must not have",
			name("cfssl-key-encipherment-profile"), name("cfssl-profile"))
	}
	return nil
}

// load reads the files the backend flags name into c, the backend's
// configuration; the local backend reads its own directories.
func (b *backendFlags) load(c *serve.Backend, log *slog.Logger) error {
	if b.signer == signerLocal {
		return nil
	}
	var err error
	if b.trustAnchors != "" {
		if c.TrustAnchors, err = readCerts(name("trust-anchors"), b.trustAnchors); err != nil {
			return err
		}
	}
	if b.servingCert != "" {
		cert, err := tls.LoadX509KeyPair(b.servingCert, b.servingKey)
		if err != nil {
			return fmt.Errorf("%s: %w", name("serving-cert-file"), err)
		}
		c.Serving = &cert
	}
	if b.signer == signerVault {
		vc, err := b.vaultConfig(log)
		if err != nil {
			return err
		}
		c.Vault = &vc
		return nil
	}
	if b.signer == signerK8sCSR {
		c.K8sCSR = b.k8scsr.config()
		return nil
	}
	var chain []*x509.Certificate
	if b.cfsslChain != "" {
		if chain, err = readCerts(name("cfssl-chain"), b.cfsslChain); err != nil {
			return err
		}
	}
	if b.cfsslURL != "" {
		rc, err := b.cfsslRemoteConfig(chain)
		if err != nil {
			return err
		}
		c.CfsslRemote = &rc
		return nil
	}
	lc, err := b.cfsslLocalConfig(chain)
	if err != nil {
		return err
	}
	c.CfsslLocal = &lc
	return nil
}

// cfsslLocalConfig is the in-process cfssl backend's configuration from
// the flags, with chain above its CA.
func (b *backendFlags) cfsslLocalConfig(chain []*x509.Certificate) (cfssl.LocalConfig, error) {
	caCerts, err := readCerts(name("cfssl-ca-cert"), b.cfsslCACert)
	if err != nil {
		return cfssl.LocalConfig{}, err
	}
	keyPEM, err := os.ReadFile(b.cfsslCAKey)
	if err != nil {
		return cfssl.LocalConfig{}, fmt.Errorf("%s: %w", name("cfssl-ca-key"), err)
	}
	key, err := pemutil.ParsePrivateKey(keyPEM)
	if err != nil {
		return cfssl.LocalConfig{}, fmt.Errorf("%s: %w", name("cfssl-ca-key"), err)
	}
	lc := cfssl.LocalConfig{CACert: caCerts[0], CAKey: key, Chain: chain, Profile: b.cfsslProfile, DNSProfile: b.cfsslIstiod}
	if b.cfsslConfig == "" && lc.DNSProfile == "" {
		lc.DNSProfile = cfssl.DefaultIstiodProfile
	}
	if b.cfsslConfig != "" {
		cfg, err := cfconfig.LoadFile(b.cfsslConfig)
		if err != nil {
			return lc, fmt.Errorf("%s: %w", name("cfssl-config"), err)
		}
		if cfg.Signing == nil {
			return lc, fmt.Errorf("%s: the file has no signing section", name("cfssl-config"))
		}
		lc.Policy = cfg.Signing
	}
	return lc, nil
}

// cfsslRemoteConfig is the remote cfssl backend's configuration from the
// flags, with chain above the server's signing CA.
func (b *backendFlags) cfsslRemoteConfig(chain []*x509.Certificate) (cfssl.RemoteConfig, error) {
	rc := cfssl.RemoteConfig{
		URL: b.cfsslURL, Profile: b.cfsslProfile, KeyEnciphermentProfile: b.cfsslKEProf, DNSProfile: b.cfsslIstiod, Label: b.cfsslLabel, Chain: chain,
	}
	var err error
	if rc.AuthKey, err = secret(name("cfssl-auth-key-file"), b.cfsslAuthFile, envCfsslAuthKey); err != nil {
		return rc, err
	}
	if b.cfsslTLSCA != "" {
		roots, err := readCerts(name("cfssl-tls-ca-file"), b.cfsslTLSCA)
		if err != nil {
			return rc, err
		}
		rc.TLS = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: keymgr.Pool(roots...)}
	}
	return rc, nil
}

func readCerts(flag, path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	certs, err := pemutil.ParseCertificates(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return certs, nil
}

// secret reads a secret from a file or, when no file is given, from an
// environment variable; never from a flag's value.
func secret(flag, file, env string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv(env)), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	return strings.TrimSpace(string(b)), nil
}
