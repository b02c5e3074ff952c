package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	cfconfig "github.com/cloudflare/cfssl/config"
	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer/cfssl"
	"github.com/spf13/pflag"
)

const signerCfssl = "cfssl"

func init() {
	registerSigner(&signerBackend{
		name: signerCfssl, usage: "cfssl (a cfssl server, or cfssl in process)",
		helpGroup: "cfssl backend", keyFlags: []string{"cfssl-url", "cfssl-ca-cert", "cfssl-profile"},
		serve: func() serveOptions { return &cfsslFlags{} },
		root:  func() rootOptions { return &cfsslRootFlags{} }, rootUsage: "cfssl (a server whose key its operator changes)",
	})
}

// cfsslFlags configure the cfssl backend: a remote server (cfssl serve,
// multirootca), or cfssl's signer in process with a CA key meshca holds.
type cfsslFlags struct {
	url, profile, keProfile, istiodProfile, label string
	authKeyFile, tlsCA                            string
	caCert, caKey, chain, config                  string
}

func (c *cfsslFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&c.url, "cfssl-url", "", "remote cfssl server URL (cfssl serve or multirootca)")
	fl.StringVar(&c.profile, "cfssl-profile", "", "cfssl signing profile; a remote profile grants exactly digital signature, server auth and client auth")
	fl.StringVar(&c.keProfile, "cfssl-key-encipherment-profile", "", "remote cfssl: profile for RSA workload keys, granting digital signature, key encipherment, server auth and client auth; without it --cfssl-profile serves RSA keys too")
	fl.StringVar(&c.istiodProfile, "cfssl-istiod-profile", "", "cfssl profile for istiod's DNS certificate (--istiod-cert-secret), granting digital signature, server auth and client auth to its names alone; in process without --cfssl-config: the default policy's \""+cfssl.DefaultIstiodProfile+"\"")
	fl.StringVar(&c.label, "cfssl-label", "", "cfssl signer label (multirootca)")
	fl.StringVar(&c.authKeyFile, "cfssl-auth-key-file", "", "file holding the hex auth key for authsign (or set "+envCfsslAuthKey+")")
	fl.StringVar(&c.tlsCA, "cfssl-tls-ca-file", "", "PEM roots verifying an https cfssl server")
	fl.StringVar(&c.caCert, "cfssl-ca-cert", "", "in-process cfssl: signing CA certificate")
	fl.StringVar(&c.caKey, "cfssl-ca-key", "", "in-process cfssl: signing CA key")
	fl.StringVar(&c.chain, "cfssl-chain", "", "certificates above the signing CA, without the root (PEM)")
	fl.StringVar(&c.config, "cfssl-config", "", "in-process cfssl: cfssl configuration file (its signing section)")
}

func (c *cfsslFlags) validate(b *backendFlags) error {
	inProcess := c.caCert != "" || c.caKey != ""
	switch {
	case b.trustAnchors == "" && !b.hasState:
		return fmt.Errorf("%s (or a CA state) is required with the cfssl signer: the trust bundle is pinned, never learned from the backend", name("trust-anchors"))
	case inProcess == (c.url != ""):
		return fmt.Errorf("cfssl signer: give either %s (remote) or %s and %s (in process)", name("cfssl-url"), name("cfssl-ca-cert"), name("cfssl-ca-key"))
	case inProcess && (c.caCert == "" || c.caKey == ""):
		return fmt.Errorf("%s and %s go together", name("cfssl-ca-cert"), name("cfssl-ca-key"))
	case !inProcess && (b.servingCert == "" || b.servingKey == ""):
		return fmt.Errorf("%s and %s are required with a remote cfssl: meshca holds no CA key to issue its own", name("serving-cert-file"), name("serving-key-file"))
	case (b.servingCert == "") != (b.servingKey == ""):
		return fmt.Errorf("%s and %s go together", name("serving-cert-file"), name("serving-key-file"))
	case inProcess && (c.authKeyFile != "" || c.tlsCA != ""):
		return fmt.Errorf("%s and %s apply to a remote cfssl only", name("cfssl-auth-key-file"), name("cfssl-tls-ca-file"))
	case inProcess && c.label != "":
		return fmt.Errorf("%s applies to a remote cfssl only", name("cfssl-label"))
	case inProcess && c.keProfile != "":
		return fmt.Errorf("%s applies to a remote cfssl only: in process, certificates carry the usages meshca derives from the key", name("cfssl-key-encipherment-profile"))
	case c.keProfile != "" && c.keProfile == c.profile:
		return fmt.Errorf("%s names the same profile as %s: a remote cfssl takes a certificate's usages from its profile, and RSA keys need key encipherment that other keys must not have",
			name("cfssl-key-encipherment-profile"), name("cfssl-profile"))
	}
	return nil
}

func (c *cfsslFlags) load(_ *backendFlags, cfg *serve.Backend, _ *slog.Logger) error {
	var chain []*x509.Certificate
	if c.chain != "" {
		var err error
		if chain, err = readCerts(name("cfssl-chain"), c.chain); err != nil {
			return err
		}
	}
	if c.url != "" {
		rc, err := c.remoteConfig(chain)
		if err != nil {
			return err
		}
		cfg.External = &cfsslExternal{remote: &rc}
		return nil
	}
	lc, err := c.localConfig(chain)
	if err != nil {
		return err
	}
	cfg.External = &cfsslExternal{local: &lc}
	return nil
}

// cfsslExternal is the cfssl backend as serve opens it: a remote server,
// or cfssl's signer in process. Exactly one is set.
type cfsslExternal struct {
	remote *cfssl.RemoteConfig
	local  *cfssl.LocalConfig
}

func (c *cfsslExternal) Name() string { return signerCfssl }

// Open builds the signer: a remote one with a probe of the server's info
// endpoint (what it signs with, cheap), or the one in process with its CA,
// which issues meshca's own serving certificate when none is given. A
// cfssl configuration's own nonzero Backdate wins over the common one.
func (c *cfsslExternal) Open(_ context.Context, env serve.ExternalEnv) (*serve.Opened, error) {
	if c.remote != nil {
		rc := *c.remote
		rc.Backdate = cmp.Or(rc.Backdate, env.Backdate)
		s, err := cfssl.NewRemote(rc)
		if err != nil {
			return nil, &serve.FieldError{Field: "cfssl-url", Err: err}
		}
		probe := func(ctx context.Context) error {
			_, err := cfssl.RemoteIssuer(ctx, rc)
			return err
		}
		return &serve.Opened{Signer: s, Remote: true, Probe: probe}, nil
	}
	lc := *c.local
	lc.Backdate = cmp.Or(lc.Backdate, env.Backdate)
	s, err := cfssl.NewLocal(lc)
	if err != nil {
		return nil, &serve.FieldError{Field: "cfssl-ca-cert", Err: err}
	}
	return &serve.Opened{Signer: s, CA: &keymgr.Authority{Cert: lc.CACert, Key: lc.CAKey, Chain: lc.Chain}, CAFlag: "cfssl-ca-cert"}, nil
}

// IstiodCert asks for the profile istiod's certificate is signed under.
func (c *cfsslExternal) IstiodCert() error {
	switch {
	case c.remote != nil && c.remote.DNSProfile == "":
		return &serve.FieldError{Field: "cfssl-istiod-profile", Err: errors.New("istiod's certificate (--istiod-cert-secret) needs a cfssl profile of its own " +
			"(docs/signers/cfssl.md, \"istiod's certificate\")")}
	case c.local != nil && c.local.DNSProfile == "":
		return &serve.FieldError{Field: "cfssl-istiod-profile", Err: errors.New("istiod's certificate (--istiod-cert-secret) needs a profile of the cfssl " +
			"signing policy of its own (the default policy's is \"istiod\")")}
	}
	return nil
}

// PodCertificates: cfssl signs them.
func (c *cfsslExternal) PodCertificates() error { return nil }

// localConfig is the in-process cfssl backend's configuration from the
// flags, with chain above its CA.
func (c *cfsslFlags) localConfig(chain []*x509.Certificate) (cfssl.LocalConfig, error) {
	caCerts, err := readCerts(name("cfssl-ca-cert"), c.caCert)
	if err != nil {
		return cfssl.LocalConfig{}, err
	}
	keyPEM, err := os.ReadFile(c.caKey)
	if err != nil {
		return cfssl.LocalConfig{}, fmt.Errorf("%s: %w", name("cfssl-ca-key"), err)
	}
	key, err := pemutil.ParsePrivateKey(keyPEM)
	if err != nil {
		return cfssl.LocalConfig{}, fmt.Errorf("%s: %w", name("cfssl-ca-key"), err)
	}
	lc := cfssl.LocalConfig{CACert: caCerts[0], CAKey: key, Chain: chain, Profile: c.profile, DNSProfile: c.istiodProfile}
	if c.config == "" {
		if lc.DNSProfile == "" {
			lc.DNSProfile = cfssl.DefaultIstiodProfile
		}
		return lc, nil
	}
	cfg, err := cfconfig.LoadFile(c.config)
	if err != nil {
		return lc, fmt.Errorf("%s: %w", name("cfssl-config"), err)
	}
	if cfg.Signing == nil {
		return lc, fmt.Errorf("%s: the file has no signing section", name("cfssl-config"))
	}
	lc.Policy = cfg.Signing
	return lc, nil
}

// remoteConfig is the remote cfssl backend's configuration from the
// flags, with chain above the server's signing CA.
func (c *cfsslFlags) remoteConfig(chain []*x509.Certificate) (cfssl.RemoteConfig, error) {
	rc := cfssl.RemoteConfig{
		URL: c.url, Profile: c.profile, KeyEnciphermentProfile: c.keProfile, DNSProfile: c.istiodProfile, Label: c.label, Chain: chain,
	}
	var err error
	if rc.AuthKey, err = secret(name("cfssl-auth-key-file"), c.authKeyFile, envCfsslAuthKey); err != nil {
		return rc, err
	}
	rc.TLS, err = cfsslTLS(name("cfssl-tls-ca-file"), c.tlsCA)
	return rc, err
}

// cfsslTLS verifies an https cfssl server with the roots in file; nil
// without one.
func cfsslTLS(flag, file string) (*tls.Config, error) {
	if file == "" {
		return nil, nil
	}
	roots, err := readCerts(flag, file)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: certs.Pool(roots...)}, nil
}

// cfsslRootFlags are the cfssl flags of a rotation step: activate checks
// the server signs with the new authority's key.
type cfsslRootFlags struct {
	url, tlsCA, label, profile string
}

func (c *cfsslRootFlags) register(fl *pflag.FlagSet, step string) {
	if step != "activate" {
		return
	}
	fl.StringVar(&c.url, "cfssl-url", "", "--signer cfssl: the cfssl server, checked to sign with the new authority's key")
	fl.StringVar(&c.tlsCA, "cfssl-tls-ca-file", "", "PEM roots verifying an https cfssl server")
	fl.StringVar(&c.label, "cfssl-label", "", "cfssl signer label (multirootca)")
	fl.StringVar(&c.profile, "cfssl-profile", "", "cfssl signing profile whose signer is checked")
}

func (c *cfsslRootFlags) open(_ context.Context, out io.Writer) (rootBackend, error) {
	return &cfsslRoot{flags: c, out: out}, nil
}

// cfsslRoot: meshca manages the trust bundle around a key change that the
// cfssl server's operator makes.
type cfsslRoot struct {
	flags *cfsslRootFlags
	out   io.Writer
}

func (c *cfsslRoot) prepare(_ context.Context, _ *keymgr.State, f *prepareFlags) (*keymgr.AuthorityRecord, error) {
	if f.certFile == "" || f.keyFile != "" || f.caDir != "" {
		return nil, errors.New("--signer cfssl: give the new root (or intermediate with --root and --chain) with --cert alone: its key belongs to the cfssl server")
	}
	f.external = f.rootFile == "" && f.chainFile == ""
	if f.external {
		return nil, nil
	}
	cert, err := readOne("--cert", f.certFile)
	if err != nil {
		return nil, err
	}
	rec := &keymgr.AuthorityRecord{Cert: cert, External: true}
	if rec.Root, err = readOne("--root", f.rootFile); err != nil {
		return nil, err
	}
	if f.chainFile != "" {
		if rec.Chain, err = readCerts("--chain", f.chainFile); err != nil {
			return nil, err
		}
	}
	return rec, nil
}

// activate checks, when the server is named, that it already signs with
// the authority's key: the operator changes it once the guard allows.
func (c *cfsslRoot) activate(ctx context.Context, _ *keymgr.State, rec *keymgr.AuthorityRecord) error {
	if c.flags.url == "" {
		fmt.Fprintln(c.out, "not checked: whether cfssl signs with the new key (give --cfssl-url to check)")
		return nil
	}
	rc := cfssl.RemoteConfig{URL: c.flags.url, Label: c.flags.label, Profile: c.flags.profile}
	var err error
	if rc.TLS, err = cfsslTLS("--cfssl-tls-ca-file", c.flags.tlsCA); err != nil {
		return err
	}
	got, err := cfssl.RemoteIssuer(ctx, rc)
	if err != nil {
		return err
	}
	if !got.Equal(rec.Cert) {
		return &exitError{code: exitRefused, err: fmt.Errorf("cfssl at %s signs with %q, not with the authority to activate (%q): switch the server to the new key (docs/rotation.md), then activate",
			c.flags.url, got.Subject, rec.Cert.Subject)}
	}
	return nil
}

func (c *cfsslRoot) retire(_ context.Context, s *keymgr.State, rec *keymgr.AuthorityRecord) error {
	if by := s.View().InUseBy(rec, rec.Cert); by != nil {
		fmt.Fprintf(c.out, "keep the key of %q: authority %s (%s) still uses it\n", strings.TrimSpace(rec.Cert.Subject.String()), shortID(by), by.Phase)
		return nil
	}
	fmt.Fprintf(c.out, "to do by the cfssl operator: destroy the key of %q, which no longer signs\n",
		strings.TrimSpace(rec.Cert.Subject.String()))
	return nil
}
