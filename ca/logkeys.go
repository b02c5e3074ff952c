package ca

// Log field names, one place so that queries over the audit log stay valid.
const (
	logAudit     = "audit"
	logCaller    = "caller"
	logMethod    = "authn"
	logPod       = "pod"
	logNode      = "node"
	logCluster   = "cluster"
	logRequested = "requested"
	logIdentity  = "identity"
	logCode      = "code"
	logReason    = "reason"
	logDetail    = "detail"
	logSerial    = "serial"
	logNotAfter  = "not_after"
	logBackend   = "backend"
	logLatency   = "latency"
	logPeer      = "peer"
)
