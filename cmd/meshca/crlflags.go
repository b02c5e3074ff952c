package main

import (
	"fmt"
	"time"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr"
	"github.com/spf13/pflag"
)

// Bounds of the CRL settings.
const (
	minCRLValidity = 10 * time.Minute
	maxCRLValidity = 7 * 24 * time.Hour
)

// crlFlags turn on the CRLs of the CA state's CAs (issue 30).
type crlFlags struct {
	on        bool
	validity  time.Duration
	refreshAt float64
}

func (f *crlFlags) register(fl *pflag.FlagSet) {
	fl.BoolVar(&f.on, "crl", false, "keep a CRL in the CA state for every CA of it that signs (each signing certificate, intermediate and root over one), signed by it and listing what \"meshca revoke\" revoked; the replica elected to rotate issues them (docs/revocation.md)")
	fl.DurationVar(&f.validity, "crl-validity", keymgr.DefaultCRLValidity, fmt.Sprintf("how long a CRL is valid (its nextUpdate from now; %v to %v): a verifier with an expired one keeps using it (ztunnel) or refuses every chain through its CA (Envoy, openssl)", minCRLValidity, maxCRLValidity))
	fl.Float64Var(&f.refreshAt, "crl-refresh-at", keymgr.DefaultCRLRefreshAt, "fraction of a CRL's validity after which it is reissued unchanged, above 0 and at most 0.75 (MeshcaCRLExpiringSoon fires after)")
}

// validate checks the flags without I/O: CRLs are the built-in CA's,
// in a CA state.
func (f *crlFlags) validate(signerName string, hasState, publish bool) error {
	switch {
	case !f.on && publish && signerName == signerLocal:
		return fmt.Errorf("--publish-crl with the built-in CA publishes the CRLs --crl keeps in the CA state, and --crl is off: add --crl (docs/revocation.md)")
	case !f.on:
		return nil
	case signerName != signerLocal:
		return fmt.Errorf("--crl: meshca signs the CRLs of the built-in CA's authorities, and --signer %s signs elsewhere (docs/backends.md)", signerName)
	case !hasState:
		return fmt.Errorf("--crl keeps its CRLs in a CA state: give --state-dir or --state-secret (a plugged-in --ca-dir has none)")
	case f.validity < minCRLValidity || f.validity > maxCRLValidity:
		return fmt.Errorf("--crl-validity %v must be between %v and %v", f.validity, minCRLValidity, maxCRLValidity)
	case f.refreshAt <= 0 || f.refreshAt > 0.75:
		return fmt.Errorf("--crl-refresh-at %v must be above 0 and at most 0.75", f.refreshAt)
	}
	return nil
}

// config is the assembly's CRL configuration; nil when off.
func (f *crlFlags) config() *serve.CRL {
	if !f.on {
		return nil
	}
	return &serve.CRL{Validity: f.validity, RefreshAt: f.refreshAt}
}
