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
	minCRLValidity    = 10 * time.Minute
	maxCRLValidity    = 7 * 24 * time.Hour
	maxCRLPropagation = time.Hour
)

// crlFlags turn on the CRLs of the CA state's CAs (issue 30).
type crlFlags struct {
	on          bool
	validity    time.Duration
	refreshAt   float64
	propagation time.Duration
}

func (f *crlFlags) register(fl *pflag.FlagSet) {
	fl.BoolVar(&f.on, "crl", false, "keep a CRL in the CA state for every CA of it that signs (each signing certificate, intermediate and root over one), signed by it and listing what \"meshca revoke\" revoked; the replica elected to rotate issues them (docs/revocation.md)")
	fl.DurationVar(&f.validity, "crl-validity", keymgr.DefaultCRLValidity, fmt.Sprintf("how long a CRL is valid (its nextUpdate from now; %v to %v): a verifier with an expired one keeps using it (ztunnel) or refuses every chain through its CA (Envoy, openssl)", minCRLValidity, maxCRLValidity))
	fl.Float64Var(&f.refreshAt, "crl-refresh-at", keymgr.DefaultCRLRefreshAt, "fraction of a CRL's validity after which it is reissued unchanged, above 0 and at most 0.75 (MeshcaCRLExpiringSoon fires after)")
	fl.DurationVar(&f.propagation, "crl-propagation", keymgr.DefaultCRLPropagation, fmt.Sprintf("how long istio-ca-crl takes to reach every proxy (a publisher round, then the kubelet's ConfigMap sync; 0 to %v): a new signing authority (an intermediate renewed from --upstream) signs its first leaf only this long after it was stored with its first CRL, the one it replaced signing meanwhile, so that no verifier sees a CA whose revocation status it does not know", maxCRLPropagation))
}

// validate checks the flags without I/O: CRLs are the built-in CA's,
// in a CA state; the propagation time fits the intermediates up.
func (f *crlFlags) validate(signerName string, hasState, publish bool, up *upstreamFlags) error {
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
	case f.propagation < 0 || f.propagation > maxCRLPropagation:
		return fmt.Errorf("--crl-propagation %v must be between 0 and %v", f.propagation, maxCRLPropagation)
	case up.name == "":
		return nil
	}
	if err := keymgr.CheckHold(f.propagation, up.ttl, up.renewAt); err != nil {
		return fmt.Errorf("--crl-propagation with --intermediate-ttl %v and --intermediate-renew-at %v: %w", up.ttl, up.renewAt, err)
	}
	return nil
}

// config is the assembly's CRL configuration; nil when off.
func (f *crlFlags) config() *serve.CRL {
	if !f.on {
		return nil
	}
	return &serve.CRL{Validity: f.validity, RefreshAt: f.refreshAt, Propagation: f.propagation}
}
