package main

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/ca/trust/bundleendpoint"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// bundleEndpointFlags are the --bundle-endpoint-* flags of serve.
type bundleEndpointFlags struct {
	listen      string
	profile     string
	id          string
	certFile    string
	keyFile     string
	refreshHint time.Duration
}

// defaultEndpointSA is the service account meshca runs as
// (deploy/manifests), named in the endpoint's default SPIFFE ID.
const defaultEndpointSA = "meshca"

func (b *bundleEndpointFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&b.listen, "bundle-endpoint-listen", "", "HTTPS address of the SPIFFE bundle endpoint (SPIFFE federation, e.g. for a SPIRE server); empty disables it")
	fl.StringVar(&b.profile, "bundle-endpoint-profile", "", "https_spiffe (an X509-SVID of meshca's own CA, local signer only) or https_web (--bundle-endpoint-cert-file); empty: https_web when a certificate is given, else https_spiffe")
	fl.StringVar(&b.id, "bundle-endpoint-spiffe-id", "", "SPIFFE ID of the endpoint's X509-SVID under https_spiffe; empty: spiffe://<trust domain>/ns/<$POD_NAMESPACE, else istio-system>/sa/"+defaultEndpointSA)
	fl.StringVar(&b.certFile, "bundle-endpoint-cert-file", "", "https_web: the endpoint's certificate chain (PEM), read again when it changes")
	fl.StringVar(&b.keyFile, "bundle-endpoint-key-file", "", "https_web: the endpoint certificate's key")
	fl.DurationVar(&b.refreshHint, "bundle-endpoint-refresh-hint", bundleendpoint.DefaultRefreshHint, "spiffe_refresh_hint: how often federated control planes should fetch the bundle (whole seconds)")
}

// config checks the flags without I/O, for a trust domain td and a
// signer, and returns the endpoint's configuration (off without
// --bundle-endpoint-listen).
func (b *bundleEndpointFlags) config(td spiffeid.TrustDomain, signer string) (serve.BundleEndpoint, error) {
	var c serve.BundleEndpoint
	if b.listen == "" {
		if b.profile != "" || b.id != "" || b.certFile != "" || b.keyFile != "" {
			return c, errors.New("--bundle-endpoint-profile, --bundle-endpoint-spiffe-id, --bundle-endpoint-cert-file and --bundle-endpoint-key-file need --bundle-endpoint-listen")
		}
		return c, nil
	}
	profile := b.profile
	if profile == "" {
		profile = bundleendpoint.ProfileSPIFFE
		if b.certFile != "" || b.keyFile != "" {
			profile = bundleendpoint.ProfileWeb
		}
	}
	switch {
	case profile != bundleendpoint.ProfileSPIFFE && profile != bundleendpoint.ProfileWeb:
		return c, fmt.Errorf("--bundle-endpoint-profile %q: want %s or %s", profile, bundleendpoint.ProfileSPIFFE, bundleendpoint.ProfileWeb)
	case (b.certFile == "") != (b.keyFile == ""):
		return c, errors.New("--bundle-endpoint-cert-file and --bundle-endpoint-key-file go together")
	case profile == bundleendpoint.ProfileWeb && b.certFile == "":
		return c, errors.New("--bundle-endpoint-profile https_web needs --bundle-endpoint-cert-file and --bundle-endpoint-key-file")
	case profile == bundleendpoint.ProfileWeb && b.id != "":
		return c, errors.New("--bundle-endpoint-spiffe-id belongs to --bundle-endpoint-profile https_spiffe; https_web presents the operator's certificate")
	case profile == bundleendpoint.ProfileSPIFFE && b.certFile != "":
		return c, errors.New("--bundle-endpoint-cert-file and --bundle-endpoint-key-file belong to --bundle-endpoint-profile https_web; https_spiffe presents an SVID of meshca's own CA")
	case profile == bundleendpoint.ProfileSPIFFE && !ownCA(signer):
		return c, fmt.Errorf("--bundle-endpoint-profile https_spiffe needs meshca's own CA key to issue the endpoint's X509-SVID, and --signer %s holds none here: give --bundle-endpoint-cert-file and --bundle-endpoint-key-file (https_web)", signer)
	case b.refreshHint < time.Second:
		return c, fmt.Errorf("--bundle-endpoint-refresh-hint %v must be at least 1s", b.refreshHint)
	}
	c = serve.BundleEndpoint{Listen: b.listen, Profile: profile, CertFile: b.certFile, KeyFile: b.keyFile, RefreshHint: b.refreshHint}
	if profile == bundleendpoint.ProfileWeb {
		return c, nil
	}
	id, err := b.spiffeID(td)
	if err != nil {
		return c, err
	}
	c.ID = id
	return c, nil
}

// spiffeID is --bundle-endpoint-spiffe-id, or the default one for td.
func (b *bundleEndpointFlags) spiffeID(td spiffeid.TrustDomain) (spiffeid.ID, error) {
	if b.id == "" {
		ns := cmp.Or(os.Getenv("POD_NAMESPACE"), "istio-system")
		id, err := spiffeid.FromSegments(td, "ns", ns, "sa", defaultEndpointSA)
		if err != nil {
			return id, fmt.Errorf("--bundle-endpoint-spiffe-id: the default from $POD_NAMESPACE %q: %w", ns, err)
		}
		return id, nil
	}
	id, err := spiffeid.FromString(b.id)
	switch {
	case err != nil:
		return id, fmt.Errorf("--bundle-endpoint-spiffe-id: %w", err)
	case !id.MemberOf(td):
		return id, fmt.Errorf("--bundle-endpoint-spiffe-id %s is not in --trust-domain %s, whose CA issues the endpoint's SVID", id, td.Name())
	}
	return id, nil
}

// ownCA says whether meshca holds the signing key of the backend named
// signer in process, to issue its own X509-SVIDs.
func ownCA(signer string) bool {
	b := signerNamed(signer)
	return b != nil && b.ownCA
}
