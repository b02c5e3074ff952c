package podcert

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

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
	ReasonNodeBlocked         = "NodeBlocked"
)

// NodeBlocked is the refusal of a Pod certificate asked for by the
// kubelet of a node blocked by a revocation (meshca revoke --node).
func NodeBlocked(node string, since time.Time) *Refusal {
	return denied(ReasonNodeBlocked, "node_blocked", fmt.Sprintf("node %s is blocked by a revocation since %s; an operator lifts it with meshca revoke --node %s --undo",
		node, since.UTC().Format(time.RFC3339), node))
}

// SignedError is an IssuePod failure after the backend signed: the
// certificate exists but is not delivered (its chain failed verification,
// or there was no trust bundle to verify it with), and its serial is
// audited as the gRPC path audits it. Err is the failure; a transient one
// (a *signer.Error of KindUnavailable) is retried without counting as a
// signing failure.
type SignedError struct {
	Leaf *x509.Certificate
	// Reason is the audit log's word for the failure, as the gRPC path
	// writes it (issued_chain_invalid, issued_wrong_identity,
	// no_trust_bundle).
	Reason string
	Err    error
}

func (e *SignedError) Error() string { return e.Err.Error() }

func (e *SignedError) Unwrap() error { return e.Err }

// Busy is an IssuePod refusal for a budget of the CA (the node's request
// rate or its requests at once, the CA's concurrency): the request is
// queued again after RetryAfter, not counted as a signing failure, and
// nothing is written to it.
type Busy struct {
	RetryAfter time.Duration
	// Reason is the CA's metric label of the budget (node_proxy_rate, ...).
	Reason string
	Err    error
}

func (e *Busy) Error() string {
	return fmt.Sprintf("podcert: over a budget of the CA (%s), retry in %v: %v", e.Reason, e.RetryAfter, e.Err)
}

func (e *Busy) Unwrap() error { return e.Err }

// retry is a decide error after IssuePod: no answer yet. counted says
// whether it is a signing failure, toward maxFailedAttempts; leaf is the
// certificate signed and then refused, if any, audited at once.
type retry struct {
	err     error
	counted bool
	leaf    *x509.Certificate
	word    string
}

func (r *retry) Error() string { return "podcert: signing: " + r.err.Error() }

func (r *retry) Unwrap() error { return r.err }

// transient reports whether err, from IssuePod, is worth retrying
// without counting it: the backend unavailable, or out of time.
func transient(err error) bool {
	var (
		se   *signer.Error
		busy *Busy
	)
	return errors.As(err, &busy) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &se) && se.Kind == signer.KindUnavailable
}

// refusalOf maps an IssuePod error to its answer, given the request's
// signing failures before this one; nil means retry later (the backend
// is unavailable, or this is not yet the maxFailedAttempts-th failure).
func refusalOf(err error, failures int) *Refusal {
	var (
		re  *csr.Error
		se  *signer.Error
		ref *Refusal
	)
	switch {
	case errors.As(err, &ref):
		return ref
	case errors.As(err, &re) && re.Reason == csr.ReasonKey:
		return denied(certv1.PodCertificateRequestConditionUnsupportedKeyType, "csr_"+string(re.Reason),
			"meshca does not sign this key type: "+re.Detail)
	case errors.As(err, &re):
		return denied(ReasonInvalidRequest, "csr_"+string(re.Reason), "the stub CSR is refused: "+re.Detail)
	case transient(err):
		return nil
	case errors.As(err, &se) && se.Kind == signer.KindRefused:
		return failed(ReasonSignerRefused, "signer_refused", "the signing backend refused the request; the CA operator must check its configuration")
	case failures+1 < maxFailedAttempts:
		return nil
	}
	return failed(ReasonSigningFailed, "signer_failed", fmt.Sprintf("signing failed %d times; the CA's log has the detail", failures+1))
}
