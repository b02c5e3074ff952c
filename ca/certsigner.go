package ca

import (
	"fmt"
	"slices"

	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
)

// metaCertSigner is the IstioCertificateRequest metadata field in which
// istio-agent names a signer: the proxy's ISTIO_META_CERT_SIGNER. The
// agent always sends the field, empty unless that variable is set;
// ztunnel never sends it.
const metaCertSigner = "CertSigner"

// Refusal reasons of the CertSigner field.
const (
	reasonUnknownCertSigner   = "unknown_cert_signer"
	reasonMalformedCertSigner = "malformed_cert_signer"
)

// checkCertSigner answers the CertSigner field of in. Absent or empty, the
// request is served as any other. A name is served only if accepted lists
// it (--cert-signers), by the one backend meshca has.
//
// istiod honours a name only as a registration authority in front of
// Kubernetes CertificateSigningRequests, where it picks the CSR's signer
// (joined to its CERT_SIGNER_DOMAIN); its own CA signs whatever the name.
// meshca refuses a name nobody listed rather than hand out, silently, a
// certificate from a signer the proxy did not ask for: the workload would
// then fail its handshakes with peers that trust only that signer's root.
func checkCertSigner(in *authpb.IstioCertificateRequest, accepted []string) error {
	v, ok := in.GetMetadata().GetFields()[metaCertSigner]
	if !ok {
		return nil
	}
	s, isString := v.GetKind().(*structpb.Value_StringValue)
	if !isString {
		return refuse(codes.InvalidArgument, reasonMalformedCertSigner, metaCertSigner+" must be a string: a signer's name, or empty", nil)
	}
	if s.StringValue == "" || slices.Contains(accepted, s.StringValue) {
		return nil
	}
	// The name is the client's own: quoted, and cut to 64 characters.
	return refuse(codes.InvalidArgument, reasonUnknownCertSigner, fmt.Sprintf(
		"%s %.64q names a signer this CA does not serve: unset ISTIO_META_CERT_SIGNER in the proxy's configuration, or have the CA's operator add the name to --cert-signers",
		metaCertSigner, s.StringValue), nil)
}
