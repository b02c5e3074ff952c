package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/vaultpki"
	"github.com/meshca/meshca/vaultauth/vaultauthprom"
	"github.com/spf13/pflag"
)

// The vault-pki upstream: a Vault PKI issuer signs the intermediate. It
// logs in with the Vault backend's flags (--vault-addr, --vault-ca-file,
// the login, --vault-pki-mount) and adds the issuer a new lineage takes.
func init() {
	registerUpstream(&upstreamKind{
		name: vaultpki.Name, usage: vaultpki.Name + " (a Vault PKI issuer signs it; its root is Vault's)",
		helpGroup: "Vault PKI upstream (logs in with the Vault backend's flags)", keyFlags: []string{"vault-pki-issuer"},
		options: func() upstreamOptions { return &vaultPKIFlags{} },
	})
}

// vaultPKIFlags are the vault-pki upstream's own flags; fl holds the
// Vault backend's, which it logs in with.
type vaultPKIFlags struct {
	fl     *pflag.FlagSet
	issuer string
}

func (p *vaultPKIFlags) register(fl *pflag.FlagSet) {
	p.fl = fl
	fl.StringVar(&p.issuer, "vault-pki-issuer", "", "the issuer of --vault-pki-mount (name or ID) a new lineage takes as its root (an intermediate issuer's root must be an issuer of the mount too); "+
		"empty: a new root issuer, meshca-root-<time>; the CA state then names the issuer by ID")
}

func (p *vaultPKIFlags) validate() error {
	v, err := vaultLoginOf(p.fl)
	if err != nil {
		return err
	}
	if strings.ContainsAny(p.issuer, "/?#") {
		return fmt.Errorf("%s %q is not an issuer's name or ID", name("vault-pki-issuer"), p.issuer)
	}
	if v.mount == "" {
		return errors.New(name("vault-pki-mount") + " must not be empty")
	}
	return v.validateUpstream(vaultpki.Name)
}

func (p *vaultPKIFlags) opener(log *slog.Logger) (serve.UpstreamOpener, error) {
	v, err := vaultLoginOf(p.fl)
	if err != nil {
		return nil, err
	}
	login, err := v.loginConfig(log)
	if err != nil {
		return nil, err
	}
	return vaultPKIOpener{c: vaultpki.Config{Login: login, Mount: v.mount, Issuer: p.issuer}}, nil
}

// vaultPKIOpener is the vault-pki upstream as the assembly opens it.
type vaultPKIOpener struct{ c vaultpki.Config }

func (vaultPKIOpener) Name() string { return vaultpki.Name }

// Open builds the upstream, its login observed by the login gauges. Its
// session logs in when first used, and again when Vault refuses it.
func (o vaultPKIOpener) Open(_ context.Context, env serve.UpstreamEnv) (upstream.Upstream, error) {
	c := o.c
	c.Login.Observer = vaultauthprom.New(env.Registerer, nil)
	u, err := vaultpki.New(c)
	if err != nil {
		return nil, &serve.FieldError{Field: "vault-addr", Err: err}
	}
	return u, nil
}
