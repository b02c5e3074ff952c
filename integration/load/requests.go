package load

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"time"

	"github.com/meshca/meshca/csr"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/structpb"
)

// Requests builds, outside any measured loop, perID requests for each of
// ids in turn, each with a fresh P-256 key and ztunnel's CSR for 24 hours;
// with impersonate, each asks for its identity by ImpersonatedIdentity as
// ztunnel does for the Pods of its node. It also returns the CSRs' PEM.
func Requests(ids []spiffeid.ID, perID int, impersonate bool) ([]*authpb.IstioCertificateRequest, [][]byte, error) {
	var reqs []*authpb.IstioCertificateRequest
	var pems [][]byte
	for range perID {
		for _, id := range ids {
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				return nil, nil, err
			}
			p, err := csr.Build(key, id)
			if err != nil {
				return nil, nil, err
			}
			req := &authpb.IstioCertificateRequest{Csr: string(p), ValidityDuration: int64(24 * time.Hour / time.Second)}
			if impersonate {
				req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{
					authpb.MetaImpersonatedIdentity: structpb.NewStringValue(id.String()),
				}}
			}
			pems, reqs = append(pems, p), append(reqs, req)
		}
	}
	return reqs, pems, nil
}
