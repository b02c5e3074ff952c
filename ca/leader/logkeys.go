package leader

// Log field names of this package's log lines.
const (
	logIdentity = "identity"
	logLease    = "lease"
	logLeader   = "leader"
)
