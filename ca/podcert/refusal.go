package podcert

import (
	"context"
	"errors"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/signer"
	certv1 "k8s.io/api/certificates/v1"
)

// Refusal is a request answered without a certificate: the condition
// written (Denied or Failed), its API reason, the stable word audited and
// counted, and the message the Pod's owner reads.
type Refusal struct {
	// Condition is certv1.PodCertificateRequestConditionTypeDenied (the
	// signer will not certify this Pod) or ...TypeFailed (it could not).
	Condition string
	// Reason is the condition's reason, as the API writes them
	// (UnsupportedKeyType, PodNotFound, ...).
	Reason string
	// Word is the audit log's and the metric's reason (pod_gone, ...).
	Word string
	// Message says what is wrong and what to do.
	Message string
}

func (r *Refusal) Error() string { return "podcert: " + r.Word + ": " + r.Message }

func denied(reason, word, msg string) *Refusal {
	return &Refusal{Condition: certv1.PodCertificateRequestConditionTypeDenied, Reason: reason, Word: word, Message: msg}
}

func failed(reason, word, msg string) *Refusal {
	return &Refusal{Condition: certv1.PodCertificateRequestConditionTypeFailed, Reason: reason, Word: word, Message: msg}
}

// Condition reasons meshca writes besides the API's own.
const (
	ReasonIssued              = "Issued"
	ReasonNamespaceNotAllowed = "NamespaceNotAllowed"
	ReasonPodNotFound         = "PodNotFound"
	ReasonPodReplaced         = "PodReplaced"
	ReasonPodTerminating      = "PodTerminating"
	ReasonServiceAccount      = "ServiceAccountMismatch"
	ReasonNode                = "NodeMismatch"
	ReasonInvalidIdentity     = "InvalidIdentity"
	ReasonInvalidRequest      = "InvalidRequest"
	ReasonSignerRefused       = "SignerRefused"
	ReasonSigningFailed       = "SigningFailed"
	ReasonLifetime            = "LifetimeOutOfRange"
)

// refusalOf maps an IssuePod error to its answer; nil means retry later
// (the backend is unavailable, or a failure has not yet been seen
// maxFailedAttempts times).
func refusalOf(err error, attempts int) *Refusal {
	var (
		re *csr.Error
		se *signer.Error
	)
	switch {
	case errors.As(err, &re) && re.Reason == csr.ReasonKey:
		return denied(certv1.PodCertificateRequestConditionUnsupportedKeyType, "csr_"+string(re.Reason),
			"meshca does not sign this key type: "+re.Detail)
	case errors.As(err, &re):
		return denied(ReasonInvalidRequest, "csr_"+string(re.Reason), "the stub CSR is refused: "+re.Detail)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil
	case errors.As(err, &se) && se.Kind == signer.KindUnavailable:
		return nil
	case errors.As(err, &se) && se.Kind == signer.KindRefused:
		return failed(ReasonSignerRefused, "signer_refused", "the signing backend refused the request; the CA operator must check its configuration")
	case attempts+1 < maxFailedAttempts:
		return nil
	}
	return failed(ReasonSigningFailed, "signer_failed", "signing failed; the CA's log has the detail")
}
