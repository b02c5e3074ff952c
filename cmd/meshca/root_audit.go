package main

import (
	"context"
	"os"
	"os/user"
	"strconv"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/keymgr"
	"github.com/spf13/cobra"
)

// stepAuditor writes the audit events of one `meshca root` run, in the
// format of the server's (ca.AuditLog): to standard error, or appended
// to --audit-log-file.
type stepAuditor struct {
	sink    ca.AuditSink
	file    *auditFile
	backend string
	id      string // request id of this run
}

// stepAuditor opens the audit log of a step on backend; it fails before
// the step is taken when the file cannot be opened.
func (a *auditFlags) stepAuditor(cmd *cobra.Command, backend string) (*stepAuditor, error) {
	sink, file, err := a.open(cmd.ErrOrStderr())
	if err != nil {
		return nil, err
	}
	return &stepAuditor{sink: sink, file: file, backend: backend, id: ca.NewRequestID()}, nil
}

// step writes the event of a rotation step: what was asked, on which
// authority, whether a guard was overridden and why, and how it ended.
func (s *stepAuditor) step(ctx context.Context, verb, authority string, forced bool, reason string, err error) {
	e := &ca.AuditEvent{Event: ca.EventRotation, Decision: ca.DecisionTaken, Source: ca.SourceCLI, RequestID: s.id,
		Caller: operator(), Pod: podName(), Backend: s.backend, Verb: verb, Authority: authority, Forced: forced, Reason: reason}
	switch {
	case err != nil:
		e.Decision, e.Detail = ca.DecisionRefused, err.Error()
	case forced:
		e.Decision = ca.DecisionForced
	}
	s.sink.Audit(ctx, e)
}

// intermediate writes the event of an intermediate a step made in its
// upstream (prepare --upstream).
func (s *stepAuditor) intermediate(ctx context.Context, rec *keymgr.AuthorityRecord) {
	s.sink.Audit(ctx, &ca.AuditEvent{Event: ca.EventIntermediate, Decision: ca.DecisionIssued, Source: ca.SourceCLI, RequestID: s.id,
		Caller: operator(), Pod: podName(), Backend: s.backend, Upstream: rec.Upstream.Type, Authority: rec.ID(),
		Serial: rec.Cert.SerialNumber.Text(16), NotAfter: rec.Cert.NotAfter})
}

// close closes the audit log file, if any.
func (s *stepAuditor) close() {
	if s.file != nil {
		_ = s.file.Close()
	}
}

// operator names the OS user running the CLI.
func operator() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "uid " + strconv.Itoa(os.Getuid())
}

// podName is namespace/name of the Pod running the CLI (a CronJob's),
// from the downward API's POD_NAMESPACE and POD_NAME, or "".
func podName() string {
	ns, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	if ns == "" || name == "" {
		return ""
	}
	return ns + "/" + name
}
