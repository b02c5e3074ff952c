// Package kube is the Kubernetes side of a request: the clusters meshca
// serves (the local one and remote ones from sanitised Secrets), the
// TokenReview authenticator and its cache, and the Pod index the node
// authorizer reads. It knows nothing of gRPC; package ca maps its errors
// to status codes.
package kube

import "fmt"

// Error is a refusal decided here. Every refusal is about who the caller
// is: ca maps it to Unauthenticated, or to Unavailable when Retry is set.
type Error struct {
	// Reason is a stable metric label, e.g. "audience_mismatch".
	Reason string
	// Msg is safe to send to the client and says what it can do.
	Msg string
	// Err is the detail for the log; it may be nil.
	Err error
	// Retry: the apiserver could not answer now; the credentials may be
	// fine and the client should retry.
	Retry bool
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("kube: %s: %s: %v", e.Reason, e.Msg, e.Err)
	}
	return fmt.Sprintf("kube: %s: %s", e.Reason, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

func refused(reason, msg string, err error) *Error {
	return &Error{Reason: reason, Msg: msg, Err: err}
}

func unavailable(reason, msg string, err error) *Error {
	return &Error{Reason: reason, Msg: msg, Err: err, Retry: true}
}

// Log field names of this package's own log lines.
const (
	logCluster = "cluster"
	logReason  = "reason"
	logSecret  = "secret"
)
