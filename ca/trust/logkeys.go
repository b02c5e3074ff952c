package trust

// Log field names of this package's log lines.
const (
	logNamespace = "namespace"
	logError     = "error"
	logIdentity  = "identity"
	logLease     = "lease"
	logLeader    = "leader"
	logName      = "name"
	logSigner    = "signer_name"
	logVersion   = "version"
	logDelay     = "delay"
	logLabel     = "label"

	logSequence          = "sequence"
	logPublishedSequence = "published_sequence"
)
