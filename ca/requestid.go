package ca

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// RequestIDHeader is the gRPC metadata key of a request's id. A client
// (or a proxy in front of meshca) may send one; the server answers with
// the id it audited the request under, in the response header.
const RequestIDHeader = "x-request-id"

// maxRequestIDLen bounds an incoming request id.
const maxRequestIDLen = 128

// NewRequestID returns a random id: 32 hex digits.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// requestID is the id of the request in ctx: the client's x-request-id
// when it sent exactly one of at most 128 printable ASCII characters
// without spaces or quotes, else a new one. sendRequestID sends it back.
func requestID(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, RequestIDHeader); len(v) == 1 && validRequestID(v[0]) {
		return v[0]
	}
	return NewRequestID()
}

// sendRequestID sets id as the x-request-id response header, or as a
// trailer when inTrailer: a refusal that a client's retry policy may
// retry must be a trailers-only response, since gRPC clients never retry
// a call that received headers. Setting either fails only without a gRPC
// stream (direct calls in tests).
func sendRequestID(ctx context.Context, id string, inTrailer bool) {
	md := metadata.Pairs(RequestIDHeader, id)
	if inTrailer {
		_ = grpc.SetTrailer(ctx, md)
		return
	}
	_ = grpc.SetHeader(ctx, md)
}

func validRequestID(s string) bool {
	if s == "" || len(s) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
