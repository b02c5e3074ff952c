package e2e

import (
	"encoding/pem"
	"testing"

	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
)

// fixedBugs are the attacks that found server bugs when the matrix was
// first run, kept as regression rows: a request message gRPC cannot
// decode was Internal (now InvalidArgument, audited); an RSA-16384
// signature was verified before the key policy refused its size (now the
// key policy first); a token whose Pod was deleted was audited as
// token_invalid (now token_bound_object_gone).
func (a *arena) fixedBugs(t *testing.T) []attack {
	gone := cluster.NewWorkload(t, a.apps, "gone-again", "node-a")
	cluster.DeletePod(t, a.apps, gone.Pod)
	a.secret(gone.Token)
	der, _ := pem.Decode([]byte(newCSR(t, a.webID)))
	raw := protowire.AppendTag(nil, 1, protowire.BytesType)
	raw = protowire.AppendBytes(raw, der.Bytes)
	raw = protowire.AppendTag(raw, 3, protowire.VarintType)
	raw = protowire.AppendVarint(raw, 86400)
	return []attack{
		// Both are refused before meshca's handler, by grpc-go's decoding
		// of the message, which maps every decoding error to Internal.
		{name: "csr/DER bytes instead of PEM", code: codes.InvalidArgument, msg: "invalid UTF-8", reason: "request_malformed",
			do: a.do(probe{token: a.web.Token, raw: raw})},
		{name: "metadata/nesting past protobuf's recursion limit", code: codes.InvalidArgument,
			msg: "recursion", reason: "request_malformed", do: a.do(probe{token: a.ztunnelA.Token, req: &authpb.IstioCertificateRequest{Csr: newCSR(t, a.webID),
				Metadata: meta("x", nested(6000))}})},
		// The brief of this matrix: an oversized key is refused by its
		// size before its signature is verified. csr.Parse verifies the
		// signature first (README's step 4 lists signature before key
		// policy), so a broken RSA-16384 CSR is refused as bad_signature:
		// the server spent a 16384-bit verification on it.
		{name: "csr/RSA-16384 refused by size before its signature is verified", code: codes.InvalidArgument,
			msg: "RSA key of 16384 bits is not allowed", reason: "csr_key_policy", do: a.asWeb(a.rsa16kBadSig)},
		// kube-apiserver 1.37 says "service account token has been
		// invalidated" of a token whose Pod is gone; reviewErrorReason
		// files it as token_invalid. The code is right.
		{name: "token/deleted Pod audit reason",
			code: codes.Unauthenticated, msg: tokenMsg, reason: "token_bound_object_gone|caller_pod_missing", do: a.do(probe{token: gone.Token,
				req: &authpb.IstioCertificateRequest{Csr: newCSR(t, workloadID(gone))}})},
	}
}
