package limit

// Log field names, the same as the audit log's (ca/logkeys.go), so that
// queries over the log stay valid.
const (
	logReason     = "reason"
	logPeer       = "peer"
	logOpenConns  = "open_connections"
	logSuppressed = "suppressed"
	// logUnauthStreams is the streams not yet authenticated.
	logUnauthStreams = "unauthenticated_streams"
)
