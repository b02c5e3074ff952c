package vaultauth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"

	"github.com/hashicorp/vault/api"
)

// Kind says whether retrying a failed Vault call can help.
type Kind string

// Kinds of Vault failure.
const (
	// KindUnavailable: Vault is down, sealed, a standby, rate limiting,
	// unreachable or slower than the deadline; retry.
	KindUnavailable Kind = "unavailable"
	// KindRefused: Vault refuses (a policy, a missing mount or role, a bad
	// request); retrying will not help until an operator acts.
	KindRefused Kind = "refused"
)

// Error is a classified Vault failure. Its message is its Err's: callers
// wrap it in their own error type (signer.Error, upstream.Error) with
// KindOf.
type Error struct {
	Kind Kind
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// KindOf is err's kind: an *Error's, KindUnavailable for a context that
// ended, and otherwise what Classify makes of it.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Classify(err).Kind
}

// Classify wraps err, a Vault call's failure, in an *Error of the kind
// that says whether a retry can help; an *Error is returned as it is.
func Classify(err error) *Error {
	var (
		ve  *Error
		re  *api.ResponseError
		ue  *url.Error
		ne  net.Error
		out = &Error{Kind: KindRefused, Err: err}
	)
	switch {
	case errors.As(err, &ve):
		return ve
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		out.Kind = KindUnavailable
	case errors.As(err, &re):
		// 5xx: down, sealed (503), standby; 429: rate limited.
		if re.StatusCode >= 500 || re.StatusCode == http.StatusTooManyRequests {
			out.Kind = KindUnavailable
		}
	case errors.As(err, &ue), errors.As(err, &ne):
		out.Kind = KindUnavailable
	}
	return out
}

func classifyLogin(err error) error {
	e := Classify(err)
	return &Error{Kind: e.Kind, Err: fmt.Errorf("login: %w", err)}
}

// IsPermissionDenied: Vault answered 403.
func IsPermissionDenied(err error) bool { return hasStatus(err, http.StatusForbidden) }

// IsNotFound: Vault answered 404.
func IsNotFound(err error) bool { return hasStatus(err, http.StatusNotFound) }

func hasStatus(err error, code int) bool {
	var re *api.ResponseError
	return errors.As(err, &re) && re.StatusCode == code
}
