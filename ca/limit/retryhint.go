package limit

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A refusal of a limit says when to retry in two ways, for two kinds of
// client: the google.rpc.RetryInfo detail of the status (read by clients
// that look at status details), and the grpc-retry-pushback-ms trailer,
// which grpc-go and the other gRPC libraries honour when a retry policy
// in their service config retries RESOURCE_EXHAUSTED: they wait that long
// before the next attempt instead of their own backoff.
const retryPushbackTrailer = "grpc-retry-pushback-ms"

// RetryInfo is the status detail saying to retry after d.
func RetryInfo(d time.Duration) *errdetails.RetryInfo {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
}

// SetRetryPushback sets the grpc-retry-pushback-ms trailer of the call
// in ctx to d, in whole milliseconds rounded up; nothing when d is not
// positive or ctx is not a gRPC call (a direct call in a test).
func SetRetryPushback(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	_ = grpc.SetTrailer(ctx, metadata.Pairs(retryPushbackTrailer, strconv.FormatInt(int64(ms), 10)))
}
