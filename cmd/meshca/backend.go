package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	cfconfig "github.com/cloudflare/cfssl/config"
	cflog "github.com/cloudflare/cfssl/log"
	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/cfssl"
	"github.com/meshca/meshca/signer/local"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Signer backends.
const (
	signerLocal = "local"
	signerCfssl = "cfssl"
	signerVault = "vault"
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
	cfsslLabel    string
	cfsslAuthFile string
	cfsslTLSCA    string
	cfsslCACert   string
	cfsslCAKey    string
	cfsslChain    string
	cfsslConfig   string
	vault         vaultFlags
}

func (b *backendFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&b.signer, "signer", signerLocal, "signing backend: local (built-in CA), cfssl or vault")
	fl.StringVar(&b.trustAnchors, "trust-anchors", "", "PEM roots workloads trust, pinned for external backends (required with --signer cfssl)")
	fl.StringVar(&b.servingCert, "serving-cert-file", "", "serving certificate chain (PEM) for external backends; must chain to --trust-anchors")
	fl.StringVar(&b.servingKey, "serving-key-file", "", "serving certificate key")
	fl.StringVar(&b.cfsslURL, "cfssl-url", "", "remote cfssl server URL (cfssl serve or multirootca)")
	fl.StringVar(&b.cfsslProfile, "cfssl-profile", "", "cfssl signing profile; a remote profile grants exactly digital signature, server auth and client auth")
	fl.StringVar(&b.cfsslKEProf, "cfssl-key-encipherment-profile", "", "remote cfssl: profile for RSA workload keys, granting digital signature, key encipherment, server auth and client auth; without it --cfssl-profile serves RSA keys too")
	fl.StringVar(&b.cfsslLabel, "cfssl-label", "", "cfssl signer label (multirootca)")
	fl.StringVar(&b.cfsslAuthFile, "cfssl-auth-key-file", "", "file holding the hex auth key for authsign (or set "+envCfsslAuthKey+")")
	fl.StringVar(&b.cfsslTLSCA, "cfssl-tls-ca-file", "", "PEM roots verifying an https cfssl server")
	fl.StringVar(&b.cfsslCACert, "cfssl-ca-cert", "", "in-process cfssl: signing CA certificate")
	fl.StringVar(&b.cfsslCAKey, "cfssl-ca-key", "", "in-process cfssl: signing CA key")
	fl.StringVar(&b.cfsslChain, "cfssl-chain", "", "certificates above the signing CA, without the root (PEM)")
	fl.StringVar(&b.cfsslConfig, "cfssl-config", "", "in-process cfssl: cfssl configuration file (its signing section)")
	b.vault.register(fl)
}

// validate checks the selection without I/O.
func (b *backendFlags) validate() error {
	switch b.signer {
	case signerLocal:
		return nil
	case signerCfssl:
	case signerVault:
		return b.validateVault()
	default:
		return fmt.Errorf("%s: %q is not one of local, cfssl, vault", name("signer"), b.signer)
	}
	inProcess := b.cfsslCACert != "" || b.cfsslCAKey != ""
	switch {
	case b.trustAnchors == "":
		return fmt.Errorf("%s is required with the cfssl signer: the trust bundle is pinned, never learned from the backend", name("trust-anchors"))
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

// backend is the signer with its trust bundle and serving certificate.
type backend struct {
	name    string
	signer  signer.Signer
	bundles x509bundle.Source
	expiry  ca.ExpirySource
	getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// run keeps the serving certificate fresh, when meshca issues it.
	run func(ctx context.Context, onError func(error))
	// runSigner keeps the backend's login alive, when it has one.
	runSigner func(ctx context.Context) error
}

func (f *serveFlags) backend(log *slog.Logger, td spiffeid.TrustDomain) (*backend, error) {
	if f.b.signer == signerLocal {
		authority, err := f.loadAuthority(log, td)
		if err != nil {
			return nil, err
		}
		mgr := keymgr.NewManager(td, authority)
		return withServingRotator(&backend{name: signerLocal, signer: local.New(local.Config{Authorities: mgr}), bundles: mgr, expiry: mgr}, mgr, f.servingNames)
	}
	anchors, err := readCerts(name("trust-anchors"), f.b.trustAnchors)
	if err != nil {
		return nil, err
	}
	be := &backend{name: f.b.signer, bundles: x509bundle.FromX509Authorities(td, anchors), expiry: anchorExpiry(anchors)}
	if f.b.signer == signerVault {
		if err := f.b.vaultSigner(be, log); err != nil {
			return nil, err
		}
		return withServingFiles(be, f.b.servingCert, f.b.servingKey)
	}
	cflog.Level = cflog.LevelCritical // meshca logs what matters; cfssl's own lines would duplicate it
	var chain []*x509.Certificate
	if f.b.cfsslChain != "" {
		if chain, err = readCerts(name("cfssl-chain"), f.b.cfsslChain); err != nil {
			return nil, err
		}
	}
	if f.b.cfsslURL != "" {
		rc, err := f.b.cfsslRemoteConfig(chain)
		if err != nil {
			return nil, err
		}
		if be.signer, err = cfssl.NewRemote(rc); err != nil {
			return nil, fmt.Errorf("%s: %w", name("cfssl-url"), err)
		}
		return withServingFiles(be, f.b.servingCert, f.b.servingKey)
	}
	caCerts, err := readCerts(name("cfssl-ca-cert"), f.b.cfsslCACert)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(f.b.cfsslCAKey)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name("cfssl-ca-key"), err)
	}
	key, err := pemutil.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name("cfssl-ca-key"), err)
	}
	lc := cfssl.LocalConfig{CACert: caCerts[0], CAKey: key, Chain: chain, Profile: f.b.cfsslProfile}
	if f.b.cfsslConfig != "" {
		cfg, err := cfconfig.LoadFile(f.b.cfsslConfig)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name("cfssl-config"), err)
		}
		if cfg.Signing == nil {
			return nil, fmt.Errorf("%s: the file has no signing section", name("cfssl-config"))
		}
		lc.Policy = cfg.Signing
	}
	if be.signer, err = cfssl.NewLocal(lc); err != nil {
		return nil, fmt.Errorf("%s: %w", name("cfssl-ca-cert"), err)
	}
	if f.b.servingCert != "" {
		return withServingFiles(be, f.b.servingCert, f.b.servingKey)
	}
	authority := &keymgr.Authority{Cert: caCerts[0], Key: key, Chain: chain, Roots: anchors}
	if err := authority.Validate(time.Now()); err != nil {
		return nil, fmt.Errorf("%s with %s: %w", name("cfssl-ca-cert"), name("trust-anchors"), err)
	}
	return withServingRotator(be, keymgr.NewManager(td, authority), f.servingNames)
}

// cfsslRemoteConfig is the remote cfssl backend's configuration from the
// flags, with chain above the server's signing CA.
func (b *backendFlags) cfsslRemoteConfig(chain []*x509.Certificate) (cfssl.RemoteConfig, error) {
	rc := cfssl.RemoteConfig{
		URL: b.cfsslURL, Profile: b.cfsslProfile, KeyEnciphermentProfile: b.cfsslKEProf, Label: b.cfsslLabel, Chain: chain,
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
		pool := x509.NewCertPool()
		for _, r := range roots {
			pool.AddCert(r)
		}
		rc.TLS = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	return rc, nil
}

// withServingRotator issues meshca's serving certificate from the CA.
func withServingRotator(be *backend, mgr *keymgr.Manager, names []string) (*backend, error) {
	rot, err := keymgr.NewServingRotator(mgr, keymgr.ServingOptions{Names: names}, nil)
	if err != nil {
		return nil, err
	}
	be.getCert, be.run = rot.GetCertificate, rot.Run
	return be, nil
}

// withServingFiles serves a certificate the operator provides.
func withServingFiles(be *backend, certFile, keyFile string) (*backend, error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name("serving-cert-file"), err)
	}
	be.getCert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &c, nil }
	return be, nil
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

// anchorExpiry reports the pinned anchors' expiry for the citadel gauges.
type anchorExpiry []*x509.Certificate

func (a anchorExpiry) RootNotAfter() time.Time {
	var t time.Time
	for _, c := range a {
		if t.IsZero() || c.NotAfter.Before(t) {
			t = c.NotAfter
		}
	}
	return t
}

// ChainNotAfter is the anchors' too: an external backend's issuing chain is
// not known before it signs.
func (a anchorExpiry) ChainNotAfter() time.Time { return a.RootNotAfter() }
