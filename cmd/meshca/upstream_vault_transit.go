package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/vaulttransit"
	"github.com/meshca/meshca/vaultauth/vaultauthprom"
	"github.com/spf13/pflag"
)

// The vault-transit upstream: the root's key is a Vault Transit key that
// signs the intermediates meshca builds. It logs in with the Vault
// backend's flags (--vault-addr, --vault-ca-file, the login) and adds the
// Transit mount and the key a new lineage takes.
func init() {
	registerUpstream(&upstreamKind{
		name: vaulttransit.Name, usage: vaulttransit.Name + " (a non-exportable Vault Transit key signs it)",
		helpGroup: "Vault Transit upstream (logs in with the Vault backend's flags)", keyFlags: []string{"vault-transit-mount"},
		options: func() upstreamOptions { return &vaultTransitFlags{} },
	})
}

// vaultTransitFlags are the vault-transit upstream's own flags; fl holds
// the Vault backend's, which it logs in with.
type vaultTransitFlags struct {
	fl         *pflag.FlagSet
	mount, key string
}

func (t *vaultTransitFlags) register(fl *pflag.FlagSet) {
	t.fl = fl
	fl.StringVar(&t.mount, "vault-transit-mount", "transit", "mount path of Vault's Transit secrets engine")
	fl.StringVar(&t.key, "vault-transit-key", "", "the Transit key a new lineage's root takes: created (exportable=false, allow_plaintext_backup=false) when absent, "+
		"its latest version taken when it exists and cannot leave Vault; empty: a new key, meshca-root-<time>; the CA state then names the key and version")
}

func (t *vaultTransitFlags) validate() error {
	v, err := vaultLoginOf(t.fl)
	switch {
	case err != nil:
		return err
	case t.mount == "":
		return fmt.Errorf("%s must not be empty", name("vault-transit-mount"))
	case strings.ContainsAny(t.key, "/?#:"):
		return fmt.Errorf("%s %q is not a Transit key's name", name("vault-transit-key"), t.key)
	}
	return v.validateUpstream(vaulttransit.Name)
}

func (t *vaultTransitFlags) opener(log *slog.Logger) (serve.UpstreamOpener, error) {
	v, err := vaultLoginOf(t.fl)
	if err != nil {
		return nil, err
	}
	login, err := v.loginConfig(log)
	if err != nil {
		return nil, err
	}
	return vaultTransitOpener{c: vaulttransit.Config{Login: login, Mount: t.mount, Key: t.key}}, nil
}

// vaultTransitOpener is the vault-transit upstream as the assembly opens
// it.
type vaultTransitOpener struct{ c vaulttransit.Config }

func (vaultTransitOpener) Name() string { return vaulttransit.Name }

// Open builds the upstream, its login observed by the login gauges.
func (o vaultTransitOpener) Open(_ context.Context, env serve.UpstreamEnv) (upstream.Upstream, error) {
	c := o.c
	c.Login.Observer = vaultauthprom.New(env.Registerer, nil)
	u, err := vaulttransit.New(c)
	if err != nil {
		return nil, &serve.FieldError{Field: "vault-addr", Err: err}
	}
	return u, nil
}
