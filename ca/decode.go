package ca

import (
	"sync"

	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	protobuf "google.golang.org/protobuf/proto"
)

// requestCodec is grpc-go's proto codec, except for a request message that
// does not decode (a csr field that is not UTF-8, metadata nested past
// protobuf's depth limit). grpc-go answers those Internal, which
// istio-agent retries, before any handler runs; this codec instead hands
// the handler an empty request and keeps the error for it, so that the
// request is refused InvalidArgument, audited and counted like every
// other malformed request.
type requestCodec struct {
	encoding.CodecV2
	failed sync.Map // *authpb.IstioCertificateRequest → error
}

func newRequestCodec() *requestCodec {
	return &requestCodec{CodecV2: encoding.GetCodecV2(proto.Name)}
}

// Unmarshal implements encoding.CodecV2.
func (c *requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if req, ok := v.(*authpb.IstioCertificateRequest); ok && err != nil {
		protobuf.Reset(req)
		c.failed.Store(req, err)
		return nil
	}
	return err
}

// takeError returns, once, the error that decoding req met, if any. The
// handler calls it first thing, so nothing stays in the map: no
// interceptor of meshca's refuses a request before its handler runs.
func (c *requestCodec) takeError(req *authpb.IstioCertificateRequest) error {
	if c == nil {
		return nil
	}
	if err, ok := c.failed.LoadAndDelete(req); ok {
		return err.(error)
	}
	return nil
}
