package e2e

import (
	"encoding/pem"
	"testing"

	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
)

// KNOWN SERVER BUGS found by the hostile-input matrix.
//
// knownBugs are attacks the server does not yet refuse as it should. Each
// row holds the correct expectation and names the bug; it is skipped
// unless MESHCA_ATTACK_BUGS is set; once the server is fixed, move the
// row to its category.
func (a *arena) knownBugs(t *testing.T) []attack {
	gone := cluster.NewWorkload(t, a.apps, "gone-again", "node-a")
	cluster.DeletePod(t, a.apps, gone.Pod)
	a.secret(gone.Token)
	der, _ := pem.Decode([]byte(newCSR(t, a.webID)))
	raw := protowire.AppendTag(nil, 1, protowire.BytesType)
	raw = protowire.AppendBytes(raw, der.Bytes)
	raw = protowire.AppendTag(raw, 3, protowire.VarintType)
	raw = protowire.AppendVarint(raw, 86400)
	const internalBug = "a request message gRPC cannot decode is answered Internal (README: only an issued certificate " +
		"failing verification is Internal; istio-agent retries Internal 5 times), not InvalidArgument"
	return []attack{
		// Both are refused before meshca's handler, by grpc-go's decoding
		// of the message, which maps every decoding error to Internal.
		{name: "bug/csr/DER bytes instead of PEM", bug: internalBug, transport: true, code: codes.InvalidArgument, msg: "invalid UTF-8",
			do: a.do(probe{token: a.web.Token, raw: raw})},
		{name: "bug/metadata/nesting past protobuf's recursion limit", bug: internalBug, transport: true, code: codes.InvalidArgument,
			msg: "recursion", do: a.do(probe{token: a.ztunnelA.Token, req: &authpb.IstioCertificateRequest{Csr: newCSR(t, a.webID),
				Metadata: meta("x", nested(6000))}})},
		// The brief of this matrix: an oversized key is refused by its
		// size before its signature is verified. csr.Parse verifies the
		// signature first (README's step 4 lists signature before key
		// policy), so a broken RSA-16384 CSR is refused as bad_signature:
		// the server spent a 16384-bit verification on it.
		{name: "bug/csr/RSA-16384 refused by size before its signature is verified",
			bug: "csr.Parse verifies an RSA-16384 signature before the key policy refuses its size", code: codes.InvalidArgument,
			msg: "RSA key of 16384 bits is not allowed", reason: "csr_key_policy", do: a.asWeb(a.rsa16kBadSig)},
		// kube-apiserver 1.37 says "service account token has been
		// invalidated" of a token whose Pod is gone; reviewErrorReason
		// files it as token_invalid. The code is right.
		{name: "bug/token/deleted Pod audit reason", bug: "the refusal of a token whose Pod was deleted is audited as token_invalid, " +
			"not token_bound_object_gone (ca/kube reviewErrorReason does not know kube-apiserver 1.37's wording)",
			code: codes.Unauthenticated, msg: tokenMsg, reason: "token_bound_object_gone|caller_pod_missing", do: a.do(probe{token: gone.Token,
				req: &authpb.IstioCertificateRequest{Csr: newCSR(t, workloadID(gone))}})},
	}
}
