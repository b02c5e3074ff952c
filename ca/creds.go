package ca

import (
	"context"
	"fmt"
	"strings"

	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// Request headers and metadata fields of the Istio CA protocol.
const (
	headerAuthorization = authpb.HeaderAuthorization
	headerClusterID     = authpb.HeaderClusterID
	bearerPrefix        = "bearer " // compared without case
	metaImpersonate     = authpb.MetaImpersonatedIdentity
)

// credentialsFrom reads the bearer token, cluster id and verified client
// certificates of a request, and the peer address for the log. A token
// longer than maxToken bytes is refused here, so that it never reaches a
// TokenReview or a cache key.
func credentialsFrom(ctx context.Context, maxToken int) (Credentials, string, error) {
	var c Credentials
	// ValueFromIncomingContext reads one key without copying the whole
	// header list, as FromIncomingContext does.
	switch auth := metadata.ValueFromIncomingContext(ctx, headerAuthorization); len(auth) {
	case 0:
	case 1:
		v := strings.TrimSpace(auth[0])
		if len(v) < len(bearerPrefix) || !strings.EqualFold(v[:len(bearerPrefix)], bearerPrefix) {
			return c, "", refuse(codes.Unauthenticated, "bad_authorization_header", "authorization header must be 'Bearer <token>'", nil)
		}
		c.Token = strings.TrimSpace(v[len(bearerPrefix):])
		if len(c.Token) > maxToken {
			return Credentials{}, "", refuse(codes.Unauthenticated, "token_too_large",
				fmt.Sprintf("bearer token is %d bytes, longer than the %d this CA accepts: send a service-account token", len(c.Token), maxToken), nil)
		}
	default:
		return c, "", refuse(codes.Unauthenticated, "bad_authorization_header", "send exactly one authorization header", nil)
	}
	switch ids := metadata.ValueFromIncomingContext(ctx, headerClusterID); len(ids) {
	case 0:
	case 1:
		c.ClusterID = ids[0]
	default:
		return c, "", refuse(codes.Unauthenticated, "bad_cluster_header", "send at most one clusterid header", nil)
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return c, "", nil
	}
	addr := ""
	if p.Addr != nil {
		addr = p.Addr.String()
	}
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
		c.PeerCerts = ti.State.PeerCertificates
	}
	return c, addr, nil
}
