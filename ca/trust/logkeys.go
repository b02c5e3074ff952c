package trust

// Log field names of this package's log lines.
const (
	logNamespace = "namespace"
	logError     = "error"
	logName      = "name"
	logSigner    = "signer_name"
	logVersion   = "version"
	logDelay     = "delay"
	logLabel     = "label"

	logLineage           = "lineage"
	logSequence          = "sequence"
	logPublishedLineage  = "published_lineage"
	logPublishedSequence = "published_sequence"
)
