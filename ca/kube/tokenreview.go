package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// DefaultAudience is the audience Istio's clients request for their tokens.
const DefaultAudience = authpb.DefaultAudience

// TokenReview user extras of bound service-account tokens.
const (
	extraPodName = "authentication.kubernetes.io/pod-name"
	extraPodUID  = "authentication.kubernetes.io/pod-uid"
	extraNode    = "authentication.kubernetes.io/node-name"
)

const (
	saGroup    = "system:serviceaccounts"
	saUsername = "system:serviceaccount:"
)

// Identity is who a service-account token says its bearer is.
type Identity struct {
	// ID is the service account's SPIFFE ID.
	ID             spiffeid.ID
	Namespace      string
	ServiceAccount string
	// Pod fields come from a bound token; empty otherwise.
	PodName string
	PodUID  string
	Node    string
}

// Reviewer authenticates a bearer token.
type Reviewer interface {
	Review(ctx context.Context, token string) (*Identity, error)
}

// TokenReviewer authenticates bearer service-account tokens with the
// Kubernetes TokenReview API.
type TokenReviewer struct {
	TrustDomain spiffeid.TrustDomain
	Client      kubernetes.Interface
	// Audiences the token must carry at least one of; DefaultAudience when
	// empty.
	Audiences []string
}

// Review implements Reviewer.
func (r *TokenReviewer) Review(ctx context.Context, token string) (*Identity, error) {
	auds := r.Audiences
	if len(auds) == 0 {
		auds = []string{DefaultAudience}
	}
	if !jwtShaped(token) {
		// Service-account tokens are JWTs; anything else would only spend
		// the apiserver client's rate budget to be refused.
		return nil, refused("token_malformed", tokenMsg, errors.New("token is not a JWT (three base64url segments)"))
	}
	tr, err := r.Client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: auds},
	}, metav1.CreateOptions{})
	if err != nil {
		// The apiserver did not answer (down, overloaded, timed out): the
		// token may be fine, so the client must retry, not give up.
		return nil, unavailable("tokenreview_failed", "cannot review the token now, retry later", err)
	}
	return identityFromReview(r.TrustDomain, auds, &tr.Status)
}

// tokenMsg is what every token refusal says on the wire; the reason tells
// the log what was wrong.
const tokenMsg = "token is not a valid service-account token for this CA"

// identityFromReview checks a TokenReview answer. Every refusal says the
// same safe thing on the wire; the reason tells the log what was wrong.
func identityFromReview(td spiffeid.TrustDomain, auds []string, st *authnv1.TokenReviewStatus) (*Identity, error) {
	fail := func(reason, detail string) error {
		return refused(reason, tokenMsg, errors.New(detail))
	}
	switch {
	case st.Error != "":
		return nil, fail(reviewErrorReason(st.Error), "TokenReview error: "+st.Error)
	case !st.Authenticated:
		return nil, fail("token_not_authenticated", "TokenReview did not authenticate the token")
	case !slices.ContainsFunc(st.Audiences, func(a string) bool { return slices.Contains(auds, a) }):
		return nil, fail("audience_mismatch", fmt.Sprintf("token audiences %q do not include any of %q", st.Audiences, auds))
	case !slices.Contains(st.User.Groups, saGroup):
		return nil, fail("not_service_account", fmt.Sprintf("user %q is not in group %s", st.User.Username, saGroup))
	}
	rest, ok := strings.CutPrefix(st.User.Username, saUsername)
	ns, sa, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || ns == "" || sa == "" || strings.Contains(sa, ":") {
		return nil, fail("bad_username", fmt.Sprintf("username %q is not system:serviceaccount:<ns>:<sa>", st.User.Username))
	}
	id, err := spiffeid.FromSegments(td, "ns", ns, "sa", sa)
	if err != nil {
		return nil, fail("bad_username", fmt.Sprintf("service account %s/%s makes no valid SPIFFE ID: %v", ns, sa, err))
	}
	return &Identity{
		ID:             id,
		Namespace:      ns,
		ServiceAccount: sa,
		PodName:        extra(st, extraPodName),
		PodUID:         extra(st, extraPodUID),
		Node:           extra(st, extraNode),
	}, nil
}

// jwtShaped reports whether token has the shape of a JWS compact
// serialisation: three base64url segments, the first two non-empty.
func jwtShaped(token string) bool {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return false
	}
	for _, p := range parts {
		if strings.TrimLeft(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			return false
		}
	}
	return true
}

func extra(st *authnv1.TokenReviewStatus, key string) string {
	if v := st.User.Extra[key]; len(v) == 1 {
		return v[0]
	}
	return ""
}

// reviewErrorReason sorts the apiserver's TokenReview error text into a
// metric label. The text is not an API, so anything unrecognised is
// "token_invalid"; the full text is always logged.
func reviewErrorReason(msg string) string {
	switch {
	case strings.Contains(msg, "expired"):
		return "token_expired"
	case strings.Contains(msg, "audience"):
		return "audience_mismatch"
	case strings.Contains(msg, "not found"), strings.Contains(msg, "has been deleted"), strings.Contains(msg, "does not match"),
		// 1.37 says this of a token whose Pod or Secret is gone
		strings.Contains(msg, "has been invalidated"):
		return "token_bound_object_gone"
	}
	return "token_invalid"
}
