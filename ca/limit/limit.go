// Package limit holds the CA's limits: the budgets of each caller and
// each peer address (token buckets, requests in flight, the review turns
// of an address that has spent its failed authentications), the issuance
// slots, the connection caps and deadlines of the gRPC server, and the
// retry hints of a refusal. A refusal of a limit is an *ExhaustedError;
// package ca maps it to its gRPC status.
package limit

import (
	"context"
	"fmt"
	"time"
)

// ExhaustedError is the refusal of a limit: the client is to retry after
// RetryAfter (package ca answers ResourceExhausted, with a RetryInfo
// detail and a grpc-retry-pushback-ms trailer: retryhint.go).
type ExhaustedError struct {
	// Reason is a stable metric label (Reasons).
	Reason string
	// Msg is safe to send to the client and says when to retry.
	Msg string
	// RetryAfter is when the client may retry.
	RetryAfter time.Duration
	// Err is the detail for the log; it may be nil.
	Err error
}

// Error reads as a ca.Error does, so that the audit log's detail of a
// refusal is the same wherever it was decided.
func (e *ExhaustedError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("ca: %s: %s: %v", e.Reason, e.Msg, e.Err)
	}
	return fmt.Sprintf("ca: %s: %s", e.Reason, e.Msg)
}

func (e *ExhaustedError) Unwrap() error { return e.Err }

// exhausted is a refusal that says when to retry.
func exhausted(reason, msg string, retry time.Duration, err error) *ExhaustedError {
	return &ExhaustedError{Reason: reason, Msg: msg, RetryAfter: retry, Err: err}
}

// Config assembles a Limiter.
type Config struct {
	// Limits are the budgets of each caller and each peer address.
	Limits Limits
	// MaxInFlight is the number of issuance slots: the authenticated
	// requests served at once.
	MaxInFlight int
	// MaxAuthnPerPeer bounds the authentications one peer address may
	// have in progress; more wait for their turn, at most
	// authnWaitingPerSlot × MaxInFlight of them over all peers.
	MaxAuthnPerPeer int
	// Now is the budgets' clock.
	Now func() time.Time
	// Sleep waits d on Now's clock, or until ctx ends; a timer when nil.
	Sleep func(ctx context.Context, d time.Duration) error
}

// authnWaitingPerSlot × MaxInFlight requests may wait for an
// authentication turn (MaxAuthnPerPeer) over all peers; more are refused
// at once. A node restart sends ~110 requests from one address at once.
const authnWaitingPerSlot = 4

// Limiter is the limits of one server: the budgets, the authentication
// turns of each peer address and the issuance slots.
type Limiter struct {
	slots  chan struct{}
	authn  *peerLimiter
	limits *limiter
}

// New returns a Limiter; c's fields must be set, but Limits' zero fields
// take their defaults and a nil Sleep a timer.
func New(c Config) *Limiter {
	limits := newLimiter(c.Limits, c.Now)
	if c.Sleep != nil {
		limits.sleep = c.Sleep
	}
	return &Limiter{slots: make(chan struct{}, c.MaxInFlight),
		authn: newPeerLimiter(c.MaxAuthnPerPeer, authnWaitingPerSlot*c.MaxInFlight), limits: limits}
}

// TakeSlot takes one of the issuance slots (--max-in-flight), or refuses
// at once: nothing queues for a slot. release gives it back.
func (l *Limiter) TakeSlot() (release func(), err error) {
	select {
	case l.slots <- struct{}{}:
		return func() { <-l.slots }, nil
	default:
		return nil, exhausted(ReasonTooManyRequests, "CA is at its concurrency limit, retry later", BusyRetryAfter, nil)
	}
}

// Admit takes a turn of c's budget, c having authenticated: one of its
// in-flight slots, then a token of its bucket. Over either, it refuses at
// once, saying when to retry. release gives the slot back.
func (l *Limiter) Admit(c Caller) (release func(), err error) { return l.limits.admit(c) }

// AdmitNode takes a turn of the node proxy budget for the kubelet of
// node, which asks for its Pods' certificates through
// PodCertificateRequests as a ztunnel does through CreateCertificate.
func (l *Limiter) AdmitNode(node string) (release func(), err error) {
	return l.limits.take(l.limits.node, "node "+node, "this node")
}
