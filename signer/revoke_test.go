package signer_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/meshca/meshca/signer"
)

type plain struct{}

func (plain) Sign(context.Context, *signer.Request) (*signer.Response, error) { return nil, nil }

type revoking struct{ plain }

func (revoking) Revoke(context.Context, signer.Revocation) error { return nil }
func (revoking) CRLs(context.Context) ([][]byte, error)          { return nil, nil }

func TestRevokerOf(t *testing.T) {
	tests := []struct {
		name    string
		s       signer.Signer
		backend string
		want    string
	}{
		{"a revoker", revoking{}, "vault", ""},
		{"cfssl", plain{}, "cfssl", "signer cfssl cannot revoke certificates: cfssl keeps its own certificate database and CRL"},
		{"k8scsr", plain{}, "k8scsr", "signer k8scsr cannot revoke certificates: the Kubernetes signer behind the CertificateSigningRequests signs"},
		{"another", plain{}, "x", "signer x cannot revoke certificates: it keeps no CRL meshca can publish"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := signer.RevokerOf(tt.s, tt.backend)
			var ne *signer.NoRevocationError
			switch {
			case tt.want == "" && (err != nil || r == nil):
				t.Fatalf("RevokerOf = %v, %v", r, err)
			case tt.want != "" && (!errors.As(err, &ne) || ne.Backend != tt.backend || !strings.Contains(err.Error(), tt.want) || r != nil):
				t.Fatalf("RevokerOf err = %v, want a NoRevocationError with %q", err, tt.want)
			}
		})
	}
}
