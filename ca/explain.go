package ca

import (
	"context"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// ExplainRequest describes a request to explain without signing anything.
type ExplainRequest struct {
	// Token is the caller's bearer token; when empty, Caller is used as is.
	Token      string
	Caller     *Caller
	Reviewer   Authenticator
	Authorizer *NodeAuthorizer
	// Requested is the ImpersonatedIdentity value, "" for the caller's own.
	Requested string
}

// Explanation is every check a request would go through, in order, and how
// it would end.
type Explanation struct {
	Steps    []Step
	Identity spiffeid.ID
	Outcome  Outcome
}

// Explain runs authentication (when a token is given) and authorization as
// CreateCertificate does and reports each check. The CSR is not part of
// it: a real request's CSR must then hold exactly Identity.
func Explain(ctx context.Context, r ExplainRequest) *Explanation {
	e := &Explanation{}
	caller := r.Caller
	if r.Token != "" {
		c, err := r.Reviewer.Authenticate(ctx, &Credentials{Token: r.Token})
		step := Step{Check: "authenticate (TokenReview)", Input: fmt.Sprintf("bearer token, %d bytes", len(r.Token)), Err: err}
		if err == nil {
			step.Note = describeCaller(c)
		}
		e.Steps = append(e.Steps, step)
		if err != nil {
			e.Outcome = classify(err)
			return e
		}
		caller = c
	}
	id, err := r.Authorizer.Trace(ctx, caller, r.Requested, func(s Step) { e.Steps = append(e.Steps, s) })
	e.Identity, e.Outcome = id, classify(err)
	return e
}

func describeCaller(c *Caller) string {
	parts := []string{"system:serviceaccount:" + c.Namespace + ":" + c.ServiceAccount}
	if c.PodName != "" {
		parts = append(parts, "pod "+c.PodName+" uid "+c.PodUID)
	}
	if c.Node != "" {
		parts = append(parts, "node "+c.Node)
	}
	return strings.Join(parts, ", ")
}
