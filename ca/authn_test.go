package ca

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/ca/limit"
)

type fixedAuthn struct{ err error }

func (f fixedAuthn) Authenticate(context.Context, *Credentials) (*Caller, error) { return nil, f.err }

// TestAuthenticateUndecided: when one method cannot decide now (the
// apiserver did not answer, the request ran out of time) or may not try
// now (the address has spent its failures), the client is told to retry,
// even if another method refused its credentials.
func TestAuthenticateUndecided(t *testing.T) {
	certRefused := fixedAuthn{refuse(codes.Unauthenticated, "cert_invalid", "client certificate is not a valid SVID", nil)}
	tests := []struct {
		name  string
		auths []Authenticator
		want  codes.Code
	}{
		{"apiserver down", []Authenticator{fixedAuthn{&kube.Error{Reason: "tokenreview_failed", Msg: "retry", Retry: true}}}, codes.Unavailable},
		{"bad certificate, apiserver down", []Authenticator{certRefused, fixedAuthn{&kube.Error{Reason: "tokenreview_failed", Msg: "retry", Retry: true}}}, codes.Unavailable},
		{"bad certificate, out of time", []Authenticator{certRefused, fixedAuthn{context.DeadlineExceeded}}, codes.DeadlineExceeded},
		{"bad certificate, bad token", []Authenticator{certRefused, fixedAuthn{&kube.Error{Reason: "token_invalid", Msg: "no"}}}, codes.Unauthenticated},
		{"bad certificate, address over its failures", []Authenticator{certRefused, fixedAuthn{&Error{Code: codes.ResourceExhausted, Reason: limit.ReasonPeerAuthnFailures, Msg: "retry"}}}, codes.ResourceExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := authenticate(context.Background(), tt.auths, &Credentials{Token: "t"})
			if got := classify(err).Code; got != tt.want {
				t.Fatalf("code %v (%v), want %v", got, err, tt.want)
			}
		})
	}
}
