package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/pkcs11"
	"github.com/spf13/pflag"
)

// envPKCS11PIN may carry the token's user PIN instead of a file.
const envPKCS11PIN = "MESHCA_PKCS11_PIN"

// The pkcs11 upstream: the root's key is in a PKCS#11 token (an HSM),
// generated there by `meshca root prepare --upstream pkcs11` and never
// leaving it; the token signs each intermediate. Only the HSM build
// (make build-hsm, the meshca-hsm image) has it; the default build's
// checks say so.
func init() {
	registerUpstream(&upstreamKind{
		name: pkcs11.Name, usage: "pkcs11 (the root's key in an HSM's PKCS#11 token signs it; the meshca-hsm build)",
		helpGroup: "PKCS#11 upstream (--upstream pkcs11)", keyFlags: []string{"pkcs11-module", "pkcs11-token-label", "pkcs11-pin-file"},
		options: func() upstreamOptions { return &pkcs11Options{slot: -1} },
	})
}

// pkcs11Options are the pkcs11 upstream's flags.
type pkcs11Options struct {
	module, tokenLabel, pinFile string
	slot                        int
}

func (o *pkcs11Options) register(fl *pflag.FlagSet) {
	fl.StringVar(&o.module, "pkcs11-module", "", "path of the HSM vendor's PKCS#11 module (a shared library), e.g. /usr/lib/softhsm/libsofthsm2.so")
	fl.StringVar(&o.tokenLabel, "pkcs11-token-label", "", "label of the token that holds the root keys (or --pkcs11-slot)")
	fl.IntVar(&o.slot, "pkcs11-slot", -1, "slot ID of the token, instead of --pkcs11-token-label; -1: none")
	fl.StringVar(&o.pinFile, "pkcs11-pin-file", "", "file holding the token's user PIN, read at start (or set "+envPKCS11PIN+")")
}

// config is the upstream's configuration, with pin.
func (o *pkcs11Options) config(pin string) pkcs11.Config {
	c := pkcs11.Config{Module: o.module, TokenLabel: o.tokenLabel, PIN: pin}
	if o.slot >= 0 {
		c.Slot = &o.slot
	}
	return c
}

func (o *pkcs11Options) validate() error {
	switch {
	case !pkcs11.Supported:
		return errors.New("--upstream pkcs11: " + pkcs11.NotBuilt)
	case o.module == "":
		return fmt.Errorf("--upstream pkcs11 needs the HSM's module: give %s", name("pkcs11-module"))
	case o.tokenLabel == "" && o.slot < 0:
		return fmt.Errorf("--upstream pkcs11 needs the token: give %s or %s", name("pkcs11-token-label"), name("pkcs11-slot"))
	case o.tokenLabel != "" && o.slot >= 0:
		return fmt.Errorf("%s and %s both name the token: give one", name("pkcs11-token-label"), name("pkcs11-slot"))
	}
	return nil
}

// opener reads the PIN: from --pkcs11-pin-file, else MESHCA_PKCS11_PIN.
func (o *pkcs11Options) opener(*slog.Logger) (serve.UpstreamOpener, error) {
	pin, err := secret(name("pkcs11-pin-file"), o.pinFile, envPKCS11PIN)
	switch {
	case err != nil:
		return nil, err
	case pin == "":
		return nil, fmt.Errorf("--upstream pkcs11 needs the token's user PIN: give %s or set %s", name("pkcs11-pin-file"), envPKCS11PIN)
	}
	return pkcs11Opener{cfg: o.config(pin)}, nil
}

// pkcs11Opener is the pkcs11 upstream as the assembly opens it.
type pkcs11Opener struct{ cfg pkcs11.Config }

func (pkcs11Opener) Name() string { return pkcs11.Name }

// Open makes the upstream and logs in to the token: a module that does
// not load or a PIN the token refuses stops meshca now; a token that
// does not answer is left to the renewer, which retries, while the
// intermediate in service keeps signing.
func (p pkcs11Opener) Open(ctx context.Context, env serve.UpstreamEnv) (upstream.Upstream, error) {
	u, err := pkcs11.New(p.cfg)
	if err != nil {
		return nil, err
	}
	if err := u.Login(ctx); err != nil {
		if upstream.KindOf(err) != upstream.KindUnavailable {
			return nil, err
		}
		if env.Log != nil {
			env.Log.Warn("the PKCS#11 token does not answer yet; the renewer will retry", "upstream", pkcs11.Name, "error", err)
		}
	}
	return u, nil
}
