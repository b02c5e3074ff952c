package istiodcert

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/meshca/meshca/keymgr"
	corev1 "k8s.io/api/core/v1"
)

// The keeper writes only a Secret it created or one marked as its own:
// --istiod-cert-secret names a Secret, and a typo there (the CA state's
// Secret, Istio's cacerts) or an istiod-tls that cert-manager keeps must
// not be overwritten. Its mark is AnnotationOwner naming the keeper (the
// Lease its replicas elect it on, namespace/name), on every Secret it
// creates (with LabelManagedBy) and on the empty Secret meshca's chart
// creates for it. A Secret of another owner is refused, never written,
// with a RefusedError naming the owner, until an operator hands it over
// with AnnotationAdopt.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "meshca"
	// labelPartOf=meshca marks the objects of meshca's chart: before
	// AnnotationOwner, the empty istiod-tls it created carried it alone.
	labelPartOf = "app.kubernetes.io/part-of"
	// AnnotationOwner names the meshca that keeps the Secret: the Lease
	// (namespace/name) its replicas elect the keeper on.
	AnnotationOwner = "meshca.io/owner"
	// AnnotationAdopt, "true" on a Secret an operator hands over, lets the
	// keeper take it whoever held it (not one holding a CA's key): it
	// writes its certificate and its own mark, drops the previous owner's
	// (cert-manager's annotations, owner references) and this annotation.
	AnnotationAdopt = "meshca.io/adopt"
)

// Refusal reasons: the label of meshca_istiod_certificate_refused and a
// log field.
const (
	RefusedCAKey          = "ca_key"          // it holds a CA's private key: never written, even when adopted
	RefusedCertManager    = "cert_manager"    // cert-manager's annotations
	RefusedOwnerReference = "owner_reference" // an owner reference
	RefusedOtherMeshca    = "other_meshca"    // AnnotationOwner names another meshca
	RefusedManagedBy      = "managed_by"      // LabelManagedBy names another manager
	RefusedUnmarked       = "unmarked"        // no mark of any owner, nor meshca's
)

// RefusalReasons are every refusal reason.
var RefusalReasons = []string{RefusedCAKey, RefusedCertManager, RefusedOwnerReference, RefusedOtherMeshca, RefusedManagedBy, RefusedUnmarked}

// cert-manager's marks on the Secret of a Certificate.
const (
	certManagerPrefix      = "cert-manager.io/"
	certManagerCertificate = "cert-manager.io/certificate-name"
	certManagerIssuer      = "cert-manager.io/issuer-name"
	certManagerIssuerKind  = "cert-manager.io/issuer-kind"
	certManagerLabel       = "controller.cert-manager.io/fao"
)

// RefusedError says the keeper will not write Secret: another owner has
// it.
type RefusedError struct {
	// Secret is namespace/name.
	Secret string
	// Reason is one of RefusalReasons.
	Reason string
	// Owner says who has it, for people: values read from the Secret are
	// quoted and cut short.
	Owner string
	// Mark is the value of AnnotationOwner that makes it the keeper's.
	Mark string
}

func (e *RefusedError) Error() string {
	if e.Reason == RefusedCAKey {
		return fmt.Sprintf("istiodcert: Secret %s is not istiod's certificate: %s; meshca never writes it, adopted or not: "+
			"--istiod-cert-secret must name istiod's serving certificate (istiod-tls)", e.Secret, e.Owner)
	}
	hint := "annotate it " + AnnotationAdopt + "=true"
	if e.Reason == RefusedCertManager {
		hint = "delete its Certificate (or cert-manager writes it back), then " + hint
	}
	return fmt.Sprintf("istiodcert: Secret %s belongs to %s: not written; meshca writes only a Secret it created or one annotated %s=%s; to hand this one over, %s",
		e.Secret, e.Owner, AnnotationOwner, e.Mark, hint)
}

// judge says whether the keeper marked mark may write s: a refusal, or
// nil and whether it must write s to make it its own (an operator's
// AnnotationAdopt, which a write consumes, or a Secret an older meshca
// wrote, or its chart created, before AnnotationOwner). cert-manager's
// marks on a Secret marked as the keeper's are a refusal: adopted while
// its Certificate still exists, it is contested, and a second adoption is
// asked for, not a silent fight.
func judge(s *corev1.Secret, mark string) (adopt bool, refused *RefusedError) {
	refuse := func(reason, owner string) (bool, *RefusedError) {
		return false, &RefusedError{Secret: s.Namespace + "/" + s.Name, Reason: reason, Owner: owner, Mark: mark}
	}
	owner, managedBy := s.Annotations[AnnotationOwner], s.Labels[LabelManagedBy]
	switch {
	case caKeyEntry(s.Data) != "":
		return refuse(RefusedCAKey, "it holds a CA's private key (entry "+quote(caKeyEntry(s.Data))+")")
	case s.Annotations[AnnotationAdopt] == "true":
		return true, nil
	case s.Annotations[certManagerCertificate] != "" || s.Annotations[certManagerIssuer] != "":
		return refuse(RefusedCertManager, fmt.Sprintf("cert-manager (Certificate %s, %s %s)", quote(s.Annotations[certManagerCertificate]),
			issuerKind(s.Annotations[certManagerIssuerKind]), quote(s.Annotations[certManagerIssuer])))
	case len(s.OwnerReferences) > 0:
		o := s.OwnerReferences[0]
		return refuse(RefusedOwnerReference, fmt.Sprintf("%s %s (its ownerReferences)", quote(o.Kind), quote(o.Name)))
	case owner == mark:
		return false, nil
	case owner != "":
		return refuse(RefusedOtherMeshca, fmt.Sprintf("another meshca (%s=%s)", AnnotationOwner, quote(owner)))
	case managedBy == ManagedBy:
		return true, nil // written by a meshca before AnnotationOwner: marked at once
	case managedBy != "":
		return refuse(RefusedManagedBy, fmt.Sprintf("%s (label %s)", quote(managedBy), LabelManagedBy))
	case s.Labels[labelPartOf] == ManagedBy:
		return true, nil // created by meshca's chart before AnnotationOwner: marked at once
	}
	return refuse(RefusedUnmarked, "no owner meshca knows of (no meshca mark)")
}

func isCertManager(annotation string) bool { return strings.HasPrefix(annotation, certManagerPrefix) }

// markSecret makes s the keeper's, marked mark: its owner annotation,
// and, when it creates or adopts s, meshca's managed-by label, without the
// adoption request and the previous owner's marks (cert-manager's, owner
// references). A Secret already the keeper's keeps its labels (the
// managed-by of the chart that created it).
func markSecret(s *corev1.Secret, mark string, adopt bool) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	if adopt {
		s.Labels[LabelManagedBy] = ManagedBy
		delete(s.Labels, certManagerLabel)
		delete(s.Annotations, AnnotationAdopt)
		maps.DeleteFunc(s.Annotations, func(k, _ string) bool { return isCertManager(k) })
		s.OwnerReferences = nil
	}
	s.Annotations[AnnotationOwner] = mark
}

// caKeyEntry returns the first entry of data that holds a CA's private
// key, as the CA state (keymgr.EncodeState) and Istio's cacerts and
// istio-ca-secret store them, or "".
func caKeyEntry(data map[string][]byte) string {
	for _, k := range slices.Sorted(maps.Keys(data)) {
		if k == keymgr.EntryState || k == keymgr.FileCAKey || (strings.HasPrefix(k, "key-") && strings.HasSuffix(k, ".pem")) {
			return k
		}
	}
	return ""
}

// maxQuoted bounds a value read from a Secret in a message.
const maxQuoted = 64

// quote quotes v, a value anyone who may edit the Secret chose, cut
// short.
func quote(v string) string {
	if len(v) > maxQuoted {
		v = v[:maxQuoted] + "..."
	}
	return strconv.Quote(v)
}

// issuerKind is cert-manager's issuer kind (Issuer, ClusterIssuer), or
// "issuer" when it is none of a kind's shape.
func issuerKind(v string) string {
	if v == "" || len(v) > maxQuoted || strings.ContainsFunc(v, func(r rune) bool { return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') }) {
		return "issuer"
	}
	return v
}

// caSecretNames are the Secrets of Istio's CA in istiod's namespace:
// cacerts (a plugged-in CA, Istio's and meshca's --ca-dir layout) and
// istio-ca-secret (istiod's self-signed CA).
var caSecretNames = []string{"cacerts", "istio-ca-secret"}

// CheckSecretName refuses a Secret namespace/name for istiod's
// certificate that is a CA's: Istio's CA Secrets, or stateSecret (the CA
// state's Secret, namespace/name; empty: none). The keeper would refuse to
// write either (RefusedCAKey), but a configuration that names one is a
// typo better refused at start.
func CheckSecretName(secret, stateSecret string) error {
	_, name, _ := strings.Cut(secret, "/")
	switch {
	case slices.Contains(caSecretNames, name):
		return fmt.Errorf("%q is Istio's CA Secret %s, which holds a CA's private key, not istiod's serving certificate (istiod-tls)", secret, name)
	case stateSecret != "" && secret == stateSecret:
		return fmt.Errorf("%q is the CA state's Secret (--state-secret), which holds the CA's keys, not istiod's serving certificate (istiod-tls)", secret)
	}
	return nil
}
