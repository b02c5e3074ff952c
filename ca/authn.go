package ca

import (
	"context"
	"crypto/x509"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
)

// Credentials are what a request presents.
type Credentials struct {
	// Token is the bearer token of the authorization header, or "".
	Token string
	// PeerCerts is the client certificate chain verified by the TLS
	// handshake, leaf first, or nil.
	PeerCerts []*x509.Certificate
	// ClusterID is the clusterid header, or "".
	ClusterID string
}

// Caller is an authenticated client.
type Caller struct {
	// ID is the caller's own identity.
	ID             spiffeid.ID
	Namespace      string
	ServiceAccount string
	// Pod fields come from a bound service-account token; empty otherwise.
	PodName string
	PodUID  string
	Node    string
	// Method is MethodToken or MethodCertificate.
	Method string
	// CertLifetime, for MethodCertificate, is the presented leaf's
	// validity, NotAfter less NotBefore: a renewal gets no longer.
	CertLifetime time.Duration
}

// Authentication methods of a Caller.
const (
	MethodToken       = "token"
	MethodCertificate = "certificate"
)

// Authenticator turns credentials into a caller.
type Authenticator interface {
	// Authenticate returns ErrNoCredentials when the credentials it
	// understands are absent, so that the next authenticator is tried.
	Authenticate(ctx context.Context, c *Credentials) (*Caller, error)
}

// ErrNoCredentials is returned by an Authenticator when the request does
// not carry its kind of credentials.
var ErrNoCredentials = errors.New("no credentials of this kind")

// authenticate authenticates r for cluster: the server's authenticators,
// then the cluster's, under the peer's budgets (limit.Authenticate).
func (s *Server) authenticate(ctx context.Context, cluster *Cluster, r *request) (*Caller, error) {
	var auths []limit.Authenticator[*Credentials, *Caller]
	for _, a := range slices.Concat(s.c.Authenticators, cluster.Authenticators) {
		auths = append(auths, a)
	}
	return limit.Authenticate(ctx, s.limits, limit.Authentication[*Credentials, *Caller]{
		Peer: r.peer, Token: r.creds.Token, PeerCerts: len(r.creds.PeerCerts) > 0, Auths: auths, Costly: costlyRefusal,
		Vouch: cluster.Vouch,
	}, func(ctx context.Context, auths []limit.Authenticator[*Credentials, *Caller]) (*Caller, error) {
		as := make([]Authenticator, len(auths))
		for i, a := range auths {
			as[i] = a
		}
		return authenticate(ctx, as, &r.creds)
	})
}

// costlyRefusal reports whether err is a refusal of the credentials that
// cost something: not one of freeRefusals.
func costlyRefusal(err error) bool {
	o := classify(err)
	return o.Code == codes.Unauthenticated && !freeRefusals[o.Reason]
}

// freeRefusals are the authentication refusals decided without a review
// or a lookup: they spend none of the peer's failures.
var freeRefusals = map[string]bool{"no_credentials": true, "token_malformed": true, "token_too_large": true}

// authenticate tries each authenticator in order; the first success wins.
// A client certificate comes first, so that a still-valid SVID renews
// without a token, as istio-agent expects.
func authenticate(ctx context.Context, auths []Authenticator, c *Credentials) (*Caller, error) {
	var failures []error
	for _, a := range auths {
		caller, err := a.Authenticate(ctx, c)
		switch {
		case err == nil:
			return caller, nil
		case errors.Is(err, ErrNoCredentials):
			continue
		}
		// A method that cannot decide now, or may not try now (the
		// address has spent its failures), decides the request: the
		// client must retry, not be told its credentials are bad.
		switch classify(err).Code {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted:
			return nil, err
		}
		failures = append(failures, err)
	}
	switch len(failures) {
	case 0:
		return nil, refuse(codes.Unauthenticated, "no_credentials",
			"no credentials: send a service-account token with audience istio-ca as 'authorization: Bearer <token>', or a valid client certificate", nil)
	case 1:
		return nil, failures[0]
	}
	return nil, errors.Join(failures...)
}

// parseWorkloadID splits spiffe://<td>/ns/<ns>/sa/<sa>.
func parseWorkloadID(id spiffeid.ID) (ns, sa string, ok bool) {
	parts := strings.Split(strings.TrimPrefix(id.Path(), "/"), "/")
	if len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa" || parts[1] == "" || parts[3] == "" {
		return "", "", false
	}
	return parts[1], parts[3], true
}
