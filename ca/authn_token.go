package ca

import (
	"context"

	"github.com/meshca/meshca/ca/kube"
)

// TokenAuthenticator authenticates a bearer service-account token through
// a kube.Reviewer (the cluster's cached TokenReview).
type TokenAuthenticator struct {
	Reviewer kube.Reviewer
}

// Authenticate implements Authenticator.
func (a *TokenAuthenticator) Authenticate(ctx context.Context, c *Credentials) (*Caller, error) {
	if c.Token == "" {
		return nil, ErrNoCredentials
	}
	id, err := a.Reviewer.Review(ctx, c.Token)
	if err != nil {
		return nil, err
	}
	return &Caller{
		ID:             id.ID,
		Namespace:      id.Namespace,
		ServiceAccount: id.ServiceAccount,
		PodName:        id.PodName,
		PodUID:         id.PodUID,
		Node:           id.Node,
		Method:         MethodToken,
	}, nil
}

// Known reports whether the reviewer already holds token's identity
// (kube.CachedTokenReviewer): a request with it costs no TokenReview.
func (a *TokenAuthenticator) Known(token string) bool {
	k, ok := a.Reviewer.(interface{ Known(string) bool })
	return ok && token != "" && k.Known(token)
}
