package ca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/signer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is a refusal decided in this package. Its Code is the gRPC code
// the client receives, and with it whether the client retries:
// Unauthenticated (who are you?), PermissionDenied (you may not have that
// identity), InvalidArgument (bad CSR, TTL or metadata), Unavailable
// (apiserver or backend down: retry), ResourceExhausted (limits: retry
// later), Internal (a bug, or a backend answer that breaks the rules).
type Error struct {
	Code codes.Code
	// Reason is a stable metric label, e.g. "audience_mismatch".
	Reason string
	// Msg is safe to send to the client and says what it can do.
	Msg string
	// Err is the detail for the log; it may be nil.
	Err error
	// RetryAfter, for ResourceExhausted, is when the client may retry;
	// it is sent as a RetryInfo detail and a grpc-retry-pushback-ms
	// trailer (ca/limit/retryhint.go).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("ca: %s: %s: %v", e.Reason, e.Msg, e.Err)
	}
	return fmt.Sprintf("ca: %s: %s", e.Reason, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

func refuse(code codes.Code, reason, msg string, err error) *Error {
	return &Error{Code: code, Reason: reason, Msg: msg, Err: err}
}

// Outcome is how a request ended, for the wire, the log and the metrics.
type Outcome struct {
	Code   codes.Code
	Reason string // metric label; "ok" on success
	Msg    string // sent to the client
	Detail string // logged, never sent
	// SignErr is Istio's citadel_server_csr_sign_err_count label, or "".
	SignErr string
	// ParseErr and IDErr mark the CSR refusals Istio counts apart:
	// citadel_server_csr_parsing_err_count, a CSR that does not parse,
	// and citadel_server_id_extraction_err_count, a CSR that names no
	// identity (istiod's old HandleCSR incremented them when
	// ParsePemEncodedCSR, then ExtractIDs of the CSR's extensions,
	// failed; its CreateCertificate never does). At most one is set.
	ParseErr, IDErr bool
	// RetryAfter is when the client may retry a refusal of a limit; 0
	// gives no hint.
	RetryAfter time.Duration
}

// Status returns the gRPC status the client receives: with a RetryInfo
// detail when the outcome says when to retry.
func (o Outcome) Status() error {
	if o.Code == codes.OK {
		return nil
	}
	st := status.New(o.Code, o.Msg)
	if o.RetryAfter > 0 {
		if withInfo, err := st.WithDetails(limit.RetryInfo(o.RetryAfter)); err == nil {
			st = withInfo
		}
	}
	return st.Err()
}

// Istio's citadel_server_csr_sign_err_count labels.
const (
	signErrNotReady = "CA_NOT_READY"
	signErrCSR      = "CSR_ERROR"
	signErrTTL      = "TTL_ERROR"
	signErrCertGen  = "CERT_GEN_ERROR"
	signErrUnknown  = "UNKNOWN"
)

// classify maps any error of the request path to its outcome. It is the
// one place that decides gRPC codes.
func classify(err error) Outcome {
	if err == nil {
		return Outcome{Code: codes.OK, Reason: "ok"}
	}
	var (
		ce *Error
		le *limit.ExhaustedError
		ke *kube.Error
		re *csr.Error
		se *signer.Error
	)
	switch {
	case errors.As(err, &ce):
		o := Outcome{Code: ce.Code, Reason: ce.Reason, Msg: ce.Msg, Detail: err.Error(), RetryAfter: ce.RetryAfter}
		if ce.Reason == reasonTTL {
			o.SignErr = signErrTTL
		} else if ce.Code == codes.Internal {
			o.SignErr = signErrCertGen
		}
		return o
	case errors.As(err, &le):
		// A limit: the client retries later, when it is told to.
		return Outcome{Code: codes.ResourceExhausted, Reason: le.Reason, Msg: le.Msg, Detail: err.Error(), RetryAfter: le.RetryAfter}
	case errors.As(err, &ke):
		if ke.Retry {
			return Outcome{Code: codes.Unavailable, Reason: ke.Reason, Msg: ke.Msg, Detail: err.Error(), SignErr: signErrNotReady}
		}
		return Outcome{Code: codes.Unauthenticated, Reason: ke.Reason, Msg: ke.Msg, Detail: err.Error()}
	case errors.As(err, &re):
		o := Outcome{Code: codes.InvalidArgument, Reason: "csr_" + string(re.Reason), Msg: "invalid CSR: " + re.Detail, Detail: err.Error(), SignErr: signErrCSR}
		// Too large is refused unparsed; malformed covers the PEM, the
		// PKCS#10 structure and the extensions the policy reads.
		o.ParseErr = re.Reason == csr.ReasonMalformed || re.Reason == csr.ReasonTooLarge
		o.IDErr = !o.ParseErr && errors.As(err, new(noIdentity))
		return o
	case errors.As(err, &se):
		return classifySigner(se, err)
	case errors.Is(err, context.DeadlineExceeded):
		return Outcome{Code: codes.DeadlineExceeded, Reason: "deadline_exceeded", Msg: "deadline exceeded", Detail: err.Error(), SignErr: signErrUnknown}
	case errors.Is(err, context.Canceled):
		return Outcome{Code: codes.Canceled, Reason: "canceled", Msg: "request canceled", Detail: err.Error(), SignErr: signErrUnknown}
	}
	return Outcome{Code: codes.Internal, Reason: "internal", Msg: "internal error", Detail: err.Error(), SignErr: signErrUnknown}
}

func classifySigner(se *signer.Error, err error) Outcome {
	o := Outcome{Detail: err.Error(), SignErr: signErrCertGen}
	var ee *signer.ExpiringError
	if errors.As(err, &ee) {
		// The CA's own intermediate ends before a certificate worth
		// issuing: the client retries, and the CA renews it meanwhile.
		o.Code, o.Reason, o.SignErr = codes.Unavailable, "ca_expiring", signErrNotReady
		o.Msg = fmt.Sprintf("the CA's signing certificate ends at %s, too soon to issue a certificate; it is renewed from its upstream, retry later",
			ee.End.UTC().Format(time.RFC3339))
		if ee.Why != "" {
			o.Msg += " (" + ee.Why + ")"
		}
		return o
	}
	switch se.Kind {
	case signer.KindUnavailable:
		o.Code, o.Reason, o.Msg = codes.Unavailable, "signer_unavailable", "signing backend unavailable, retry later"
		o.SignErr = signErrNotReady
	case signer.KindRefused:
		o.Code, o.Reason, o.Msg = codes.FailedPrecondition, "signer_refused", "signing backend refused the request; the CA operator must check its configuration"
	default:
		o.Code, o.Reason, o.Msg = codes.Internal, "signer_failed", "signing failed"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// The deadline is often meshca's own --request-timeout, not the
		// client's: a backend that did not answer in time is unavailable,
		// as one that refused the connection is, and the client retries.
		o.Code, o.Reason, o.Msg = codes.Unavailable, "signer_timeout", "signing backend did not answer in time, retry later"
		o.SignErr = signErrNotReady
	}
	return o
}

// noIdentity marks the policy's refusal of a CSR that names no URI, from
// which no SPIFFE ID can be extracted: Istio's ID extraction error,
// whichever rule of the policy refused it first.
type noIdentity struct{ error }

func (e noIdentity) Unwrap() error { return e.error }

// policyRefusal is err, the policy's refusal of req, marked noIdentity
// when req names no URI (no subjectAltName, an empty one, or other kinds
// of names only).
func policyRefusal(req *x509.CertificateRequest, err error) error {
	if err != nil && len(req.URIs) == 0 {
		return noIdentity{err}
	}
	return err
}
