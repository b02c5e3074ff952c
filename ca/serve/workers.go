package serve

import "google.golang.org/grpc"

// streamWorkers is how many goroutines the gRPC server keeps to run
// requests on. A request needs a deeper stack than a new goroutine starts
// with (ASN.1 and ECDSA), and a worker keeps the stack it grew, so requests
// do not pay for growing one (runtime.morestack was 4% of meshca's CPU
// under load, 1.4% with workers; docs/performance.md). When all are busy,
// a request gets a new goroutine as without them. Idle, each holds a few
// tens of KiB.
const streamWorkers = 64

func grpcOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(streamWorkers)}
}
