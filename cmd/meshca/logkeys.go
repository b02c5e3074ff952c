package main

// Field names of the log lines the command writes itself.
const (
	logPath        = "path"
	logError       = "error"
	logGoMemLimit  = "gomemlimit"
	logMemoryLimit = "memory_limit"
	logSoftLimit   = "soft_limit_bytes"
)
