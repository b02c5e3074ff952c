package ca_test

import (
	"context"
	"strings"
	"testing"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/internal/testca"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestCertSigner: istio-agent's CertSigner field. Absent or empty, the
// request is served; a name --cert-signers lists is served by the one
// backend; any other name is refused InvalidArgument with what to change,
// a value that is not a string as malformed; credentials are checked
// first. Each refusal has its own reason in the audit log and in
// meshca_requests_total, and none is a CSR error of Istio's.
func TestCertSigner(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	long := strings.Repeat("s", 100)
	tests := []struct {
		name     string
		accepted []string
		token    string // "frontend-token" when empty
		value    *structpb.Value
		code     codes.Code
		msg      string
		reason   string
	}{
		{name: "absent", code: codes.OK, reason: "ok"},
		{name: "empty, as istio-agent sends it", value: structpb.NewStringValue(""), code: codes.OK, reason: "ok"},
		{name: "empty, with names accepted", accepted: []string{"clusterA"}, value: structpb.NewStringValue(""), code: codes.OK, reason: "ok"},
		{name: "an accepted name", accepted: []string{"clusterB", "clusterA"}, value: structpb.NewStringValue("clusterA"), code: codes.OK, reason: "ok"},
		{name: "a name none accepted", value: structpb.NewStringValue("clusterA"), code: codes.InvalidArgument,
			msg: `CertSigner "clusterA" names a signer this CA does not serve: unset ISTIO_META_CERT_SIGNER in the proxy's configuration, ` +
				"or have the CA's operator add the name to --cert-signers", reason: "unknown_cert_signer"},
		{name: "a name not accepted", accepted: []string{"clusterA"}, value: structpb.NewStringValue("clusterA "), code: codes.InvalidArgument,
			msg: `CertSigner "clusterA " names a signer`, reason: "unknown_cert_signer"},
		{name: "a long name, cut in the message", value: structpb.NewStringValue(long), code: codes.InvalidArgument,
			msg: `CertSigner "` + long[:64] + `" names`, reason: "unknown_cert_signer"},
		{name: "a number", value: structpb.NewNumberValue(1), code: codes.InvalidArgument,
			msg: "CertSigner must be a string: a signer's name, or empty", reason: "malformed_cert_signer"},
		{name: "null", accepted: []string{""}, value: structpb.NewNullValue(), code: codes.InvalidArgument,
			msg: "CertSigner must be a string", reason: "malformed_cert_signer"},
		{name: "a list", value: structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("clusterA")}}),
			code: codes.InvalidArgument, msg: "CertSigner must be a string", reason: "malformed_cert_signer"},
		{name: "credentials first", token: "who-knows", value: structpb.NewStringValue("clusterA"), code: codes.Unauthenticated,
			msg: "bad token", reason: "test_bad_token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, root.Authority(), options{config: func(c *ca.Config) { c.CertSigners = tt.accepted }})
			in := &authpb.IstioCertificateRequest{Csr: frontendCSR(t)}
			if tt.value != nil {
				in.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{"CertSigner": tt.value}}
			}
			token := tt.token
			if token == "" {
				token = "frontend-token"
			}
			resp, err := f.srv.CreateCertificate(inProcess(context.Background(), "192.0.2.1:5000", token), in)
			st := status.Convert(err)
			if st.Code() != tt.code || !strings.Contains(st.Message(), tt.msg) {
				t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), tt.code, tt.msg)
			}
			if tt.code == codes.OK && len(resp.GetCertChain()) < 2 {
				t.Fatalf("served with a chain of %d elements", len(resp.GetCertChain()))
			}
			if strings.Contains(st.Message(), long[:65]) {
				t.Error("the whole long name reached the message")
			}
			if !strings.Contains(f.logs.String(), `"reason":"`+tt.reason+`"`) {
				t.Errorf("audit log lacks reason %s", tt.reason)
			}
			wantSample(t, f.reg, "meshca_requests_total", map[string]string{"code": tt.code.String(), "reason": tt.reason}, 1)
			wantSample(t, f.reg, "citadel_server_csr_sign_err_count", map[string]string{"error": "CSR_ERROR"}, 0)
		})
	}
}
