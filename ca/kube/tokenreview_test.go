package kube

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestIdentityFromReview(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	good := func() authnv1.TokenReviewStatus {
		return authnv1.TokenReviewStatus{
			Authenticated: true,
			Audiences:     []string{"istio-ca"},
			User: authnv1.UserInfo{
				Username: "system:serviceaccount:prod:frontend",
				Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:prod", "system:authenticated"},
				Extra: map[string]authnv1.ExtraValue{
					extraPodName: {"frontend-1"}, extraPodUID: {"uid-1"}, extraNode: {"node-a"},
				},
			},
		}
	}
	tests := []struct {
		name   string
		mutate func(*authnv1.TokenReviewStatus)
		reason string
	}{
		{name: "valid"},
		{name: "expired", mutate: func(s *authnv1.TokenReviewStatus) {
			s.Error = "[invalid bearer token, service account token has expired]"
		}, reason: "token_expired"},
		{name: "audience error", mutate: func(s *authnv1.TokenReviewStatus) {
			s.Error = `token audiences ["x"] is invalid for the target audiences ["istio-ca"]`
		}, reason: "audience_mismatch"},
		{name: "pod gone", mutate: func(s *authnv1.TokenReviewStatus) { s.Error = `pods "frontend-1" not found` }, reason: "token_bound_object_gone"},
		{name: "token invalidated (1.37: its Pod is gone)", mutate: func(s *authnv1.TokenReviewStatus) { s.Error = "service account token has been invalidated" },
			reason: "token_bound_object_gone"},
		{name: "other error", mutate: func(s *authnv1.TokenReviewStatus) { s.Error = "invalid bearer token" }, reason: "token_invalid"},
		{name: "not authenticated", mutate: func(s *authnv1.TokenReviewStatus) { s.Authenticated = false }, reason: "token_not_authenticated"},
		{name: "wrong audience", mutate: func(s *authnv1.TokenReviewStatus) { s.Audiences = []string{"api"} }, reason: "audience_mismatch"},
		{name: "no audience", mutate: func(s *authnv1.TokenReviewStatus) { s.Audiences = nil }, reason: "audience_mismatch"},
		{name: "not a service account", mutate: func(s *authnv1.TokenReviewStatus) { s.User.Groups = []string{"system:authenticated"} }, reason: "not_service_account"},
		{name: "user name", mutate: func(s *authnv1.TokenReviewStatus) { s.User.Username = "alice" }, reason: "bad_username"},
		{name: "user name missing sa", mutate: func(s *authnv1.TokenReviewStatus) { s.User.Username = "system:serviceaccount:prod" }, reason: "bad_username"},
		{name: "user name extra colon", mutate: func(s *authnv1.TokenReviewStatus) { s.User.Username = "system:serviceaccount:prod:a:b" }, reason: "bad_username"},
		{name: "user name bad segment", mutate: func(s *authnv1.TokenReviewStatus) { s.User.Username = "system:serviceaccount:..:x" }, reason: "bad_username"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := good()
			if tt.mutate != nil {
				tt.mutate(&st)
			}
			c, err := identityFromReview(td, []string{"istio-ca"}, &st)
			if tt.reason == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.ID.String() != "spiffe://cluster.local/ns/prod/sa/frontend" || c.PodName != "frontend-1" || c.PodUID != "uid-1" || c.Node != "node-a" {
					t.Fatalf("caller = %+v", c)
				}
				return
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.Reason != tt.reason || ce.Retry {
				t.Fatalf("err = %v, want Unauthenticated %s", err, tt.reason)
			}
		})
	}
}

// TestTokenReviewerApiserverDown: a TokenReview the apiserver does not
// answer (refused, timed out) is a retryable failure, never a refusal of
// the token.
func TestTokenReviewerApiserverDown(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	const token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
	tests := []struct {
		name    string
		reactor k8stesting.ReactionFunc
		timeout time.Duration
	}{
		{name: "connection refused", reactor: func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
		}},
		{name: "overloaded", reactor: func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewTooManyRequests("slow down", 1)
		}},
		{name: "timed out", timeout: time.Millisecond, reactor: func(k8stesting.Action) (bool, runtime.Object, error) {
			time.Sleep(50 * time.Millisecond)
			return true, nil, context.DeadlineExceeded
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			client.PrependReactor("create", "tokenreviews", tt.reactor)
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			_, err := (&TokenReviewer{TrustDomain: td, Client: client}).Review(ctx, token)
			var ke *Error
			if !errors.As(err, &ke) || !ke.Retry || ke.Reason != "tokenreview_failed" {
				t.Fatalf("err = %v, want a retryable tokenreview_failed", err)
			}
		})
	}
}
