// Package csr parses PKCS#10 certificate signing requests from untrusted
// callers and checks them against the one identity the caller may receive.
//
// The package neither logs nor knows about gRPC: it returns *Error values
// whose Reason is stable (a metric label) and whose Detail is safe to show
// to the client that sent the request.
package csr

import "fmt"

// Reason classifies why a request was refused. The values are stable and
// are used as metric labels.
type Reason string

// Reasons a CSR is refused.
const (
	ReasonMalformed  Reason = "malformed"          // not one well-formed PEM PKCS#10 request
	ReasonTooLarge   Reason = "too_large"          // over the size limit
	ReasonSignature  Reason = "bad_signature"      // the self-signature does not verify
	ReasonIdentity   Reason = "identity_mismatch"  // the URI SAN is not the authorized identity
	ReasonExtraName  Reason = "extra_name"         // DNS, IP, email or other SANs, or a foreign CN
	ReasonExtension  Reason = "extension"          // an extension outside the allow-list
	ReasonCA         Reason = "ca_requested"       // basicConstraints CA:true
	ReasonKey        Reason = "key_policy"         // key algorithm or size not allowed
	ReasonUsage      Reason = "usage_not_allowed"  // a key usage a workload may not have
	ReasonUnknownUse Reason = "unknown_usage_name" // a usage name outside the vocabulary
)

// Error is returned for every refused request.
type Error struct {
	Reason Reason
	// Detail says what is wrong in terms a client can act on. It never holds
	// key material.
	Detail string
	// Err, when set, is the error of a library that Detail sums up; its
	// text is for the log (Error includes it), never for the client.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("csr: %s: %s: %v", e.Reason, e.Detail, e.Err)
	}
	return fmt.Sprintf("csr: %s: %s", e.Reason, e.Detail)
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

func errorf(r Reason, format string, args ...any) *Error {
	return &Error{Reason: r, Detail: fmt.Sprintf(format, args...)}
}
