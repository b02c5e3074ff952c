package trust

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The labels meshca puts on the ClusterTrustBundle it publishes. A Pod
// mounts it with a clusterTrustBundle projected volume by signerName and
// a labelSelector on LabelTrustDomain.
const (
	// LabelManagedBy marks the objects meshca owns: it never writes a
	// ClusterTrustBundle without LabelManagedBy=ManagedBy.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "meshca"
	// LabelTrustDomain holds the trust domain whose roots the bundle
	// carries.
	LabelTrustDomain = "meshca.io/trust-domain"
)

// unlinkedPrefix begins the name of a ClusterTrustBundle linked to no
// signer.
const unlinkedPrefix = "meshca-"

// ClusterTrustBundleName is the name of the ClusterTrustBundle meshca
// publishes for td, following the API's rules: linked to signerName, it is
// the signer name with '/' replaced by ':', then ':' and the trust domain
// ("meshca.io:svid:cluster.local"); linked to no signer (signerName
// empty), "meshca-" and the trust domain ("meshca-cluster.local"). An
// underscore, legal in a trust domain but not in a name, becomes '-'. It
// fails when signerName is not a valid signer name, or when td cannot
// make a valid name or a label value (longer than 63 characters, say).
func ClusterTrustBundleName(signerName string, td spiffeid.TrustDomain) (string, error) {
	if td.IsZero() {
		return "", errors.New("trust: ClusterTrustBundle: no trust domain")
	}
	if errs := validation.IsValidLabelValue(td.Name()); len(errs) > 0 {
		return "", fmt.Errorf("trust: ClusterTrustBundle: trust domain %q is not a valid label value: %s", td.Name(), strings.Join(errs, "; "))
	}
	suffix := strings.ReplaceAll(td.Name(), "_", "-")
	if signerName == "" {
		name := unlinkedPrefix + suffix
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return "", fmt.Errorf("trust: ClusterTrustBundle: name %q from trust domain %q: %s", name, td.Name(), strings.Join(errs, "; "))
		}
		return name, nil
	}
	if err := ValidateSignerName(signerName); err != nil {
		return "", err
	}
	if errs := validation.IsDNS1123Subdomain(suffix); len(errs) > 0 {
		return "", fmt.Errorf("trust: ClusterTrustBundle: name suffix %q from trust domain %q: %s", suffix, td.Name(), strings.Join(errs, "; "))
	}
	return strings.ReplaceAll(signerName, "/", ":") + ":" + suffix, nil
}

// ValidateSignerName checks a signer name as the certificates API does,
// "<domain>/<path>": a domain of at least two DNS labels, one '/', a path
// of dot-separated DNS subdomains. The kubernetes.io and k8s.io domains
// are the Kubernetes project's and refused.
func ValidateSignerName(name string) error {
	domain, path, ok := strings.Cut(name, "/")
	labels := strings.Split(domain, ".")
	switch {
	case !ok || strings.Contains(path, "/"):
		return signerNameError(name, "want exactly one '/', as in example.com/signer")
	case len(domain) > validation.DNS1123SubdomainMaxLength:
		return signerNameError(name, "the domain is longer than 253 characters")
	case len(labels) < 2:
		return signerNameError(name, "the domain needs at least two labels, as in example.com")
	case reserved(domain):
		return signerNameError(name, "the kubernetes.io and k8s.io domains are reserved for Kubernetes")
	}
	for _, l := range labels {
		if errs := validation.IsDNS1123Label(l); len(errs) > 0 {
			return signerNameError(name, fmt.Sprintf("domain label %q: %s", l, strings.Join(errs, "; ")))
		}
	}
	for _, s := range strings.Split(path, ".") {
		if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
			return signerNameError(name, fmt.Sprintf("path %q: %s", path, strings.Join(errs, "; ")))
		}
	}
	return nil
}

func reserved(domain string) bool {
	for _, r := range []string{"kubernetes.io", "k8s.io"} {
		if domain == r || strings.HasSuffix(domain, "."+r) {
			return true
		}
	}
	return false
}

func signerNameError(name, why string) error {
	return fmt.Errorf("trust: signer name %q: %s", name, why)
}
