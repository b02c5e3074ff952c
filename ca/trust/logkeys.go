package trust

// Log field names of this package's log lines.
const (
	logNamespace = "namespace"
	logError     = "error"
	logIdentity  = "identity"
	logLease     = "lease"
	logLeader    = "leader"
)
