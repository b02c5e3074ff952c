package ca

import (
	"context"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"google.golang.org/grpc/codes"
)

// Kinds of audit event.
const (
	// EventCertificate is one CreateCertificate: issued or denied.
	EventCertificate = "certificate"
	// EventRotation is one root rotation step (prepare, activate, retire),
	// taken by `meshca root` or by automatic rotation.
	EventRotation = "rotation"
	// EventConfig is the effective configuration of a starting server.
	EventConfig = "config"
	// EventIntermediate is one signing intermediate issued by an upstream
	// (meshca serve --upstream), or a renewal that failed.
	EventIntermediate = "intermediate"
	// EventRevocation is one meshca revoke run: certificates revoked or
	// taken back, a node blocked or unblocked.
	EventRevocation = "revocation"
	// EventCRL is one CRL signed and stored for a CA (serve --crl), or a
	// CA whose CRL could not be signed.
	EventCRL = "crl"
)

// Decisions of audit events.
const (
	DecisionIssued  = "issued"  // a certificate was returned
	DecisionDenied  = "denied"  // a request was refused (Code and Reason say why)
	DecisionTaken   = "taken"   // a rotation step passed its guard
	DecisionForced  = "forced"  // a rotation step was taken with --force, overriding its guard
	DecisionRefused = "refused" // a rotation step was refused by its guard, or failed
	DecisionLoaded  = "loaded"  // a configuration was loaded
)

// Sources of rotation steps.
const (
	SourceCLI  = "cli"  // `meshca root`
	SourceAuto = "auto" // automatic rotation in `meshca serve`
)

// AuditEvent is one decision. Fields left zero are left out of the
// record. It never holds a token, a key or a CSR: only who asked, what
// for, what was decided and why.
type AuditEvent struct {
	Time     time.Time
	Event    string // EventCertificate, EventRotation, EventCRL, ...
	Decision string // DecisionIssued, DecisionDenied, ...
	// Message is the record's human summary; empty takes one from Event
	// and Decision.
	Message string
	// RequestID correlates the event with the client (x-request-id) or
	// with one `meshca root` run.
	RequestID string

	// Who asked: the caller's SPIFFE ID (or, for `meshca root`, the OS
	// user), how it authenticated, its Pod (namespace/name) and node, its
	// address and its cluster.
	Caller, Authn, Pod, Node, Peer, Cluster string

	// What was asked and decided. Requested is the ImpersonatedIdentity
	// asked for (empty: the caller's own); Identity is what was
	// authorized. Code is the gRPC code, Reason a stable word for the
	// decision (for a rotation step: the operator's --reason, or why
	// automatic rotation took it), Detail what happened in full (never
	// sent to the client).
	Requested, Identity  string
	Code, Reason, Detail string

	// What was issued (certificates): the leaf's serial and NotAfter, the
	// backend that signed (also of rotation steps), how long it took.
	Serial   string
	NotAfter time.Time
	Backend  string
	Latency  time.Duration
	// Issuer is the ID (SHA-256 fingerprint, keymgr.Fingerprint) of the
	// CA certificate that signed the leaf: the issuer a revocation of it
	// names. ProxyNode is the node whose proxy (a trusted node account)
	// the leaf was issued through, for meshca revoke --node.
	Issuer, ProxyNode string

	// Rotation steps: prepare, activate or retire; the authority's id;
	// whether --force was given; SourceCLI or SourceAuto.
	Verb, Authority string
	Forced          bool
	Source          string

	// Intermediates (and rotation steps that made one): the upstream
	// that signed, and the authority the renewal replaced (Authority is
	// the new one's id; NotAfter and Serial are the intermediate's).
	Upstream, Replaced string

	// CRLs: the CRL's number (decimal) and how many certificates it
	// lists; Issuer is its CA's id, NotAfter its nextUpdate, Reason why
	// it was issued.
	CRLNumber string
	Entries   int

	// Configuration: meshca's version, every setting, the MESHCA_*
	// variables that name no setting, the --config file read, if any.
	Version    string
	Settings   map[string]AuditSetting
	IgnoredEnv []string
	ConfigFile string
}

// AuditSetting is one setting's effective value (secrets redacted) and
// where it came from: "flag", "config", "env MESHCA_...", "env <Istio
// variable>" or "default".
type AuditSetting struct {
	Value  any    `json:"value"`
	Source string `json:"source"`
}

// AuditSink receives the event of every decision. Implementations are
// safe for concurrent use and do not block for long: they run on the
// request path.
type AuditSink interface {
	Audit(ctx context.Context, e *AuditEvent)
}

// AuditLog writes events as structured log records: one JSON object per
// line with NewAuditLog, whose fields are named in logkeys.go.
type AuditLog struct {
	h    slog.Handler
	host string
}

// NewAuditLog writes one JSON line per event to w, e.g. os.Stdout or a
// file opened for appending. Every record says "audit":true and the host
// (Pod) name, so that it can be told apart, and its replica found, in a
// stream mixed with other logs.
func NewAuditLog(w io.Writer) *AuditLog {
	host, _ := os.Hostname()
	return &AuditLog{h: slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}), host: host}
}

// AuditLogger writes events through l's handler (into the operational
// log): what a Config without an Audit sink gets.
func AuditLogger(l *slog.Logger) *AuditLog { return &AuditLog{h: l.Handler()} }

// Audit implements AuditSink.
func (l *AuditLog) Audit(ctx context.Context, e *AuditEvent) {
	level := slog.LevelInfo
	if e.Decision == DecisionDenied || e.Decision == DecisionRefused || e.Decision == DecisionForced {
		level = slog.LevelWarn
	}
	if !l.h.Enabled(ctx, level) {
		return
	}
	t := e.Time
	if t.IsZero() {
		t = time.Now()
	}
	r := slog.NewRecord(t.UTC(), level, e.message(), 0)
	r.AddAttrs(e.attrs(l.host)...)
	_ = l.h.Handle(ctx, r)
}

func (e *AuditEvent) message() string {
	switch {
	case e.Message != "":
		return e.Message
	case e.Event == EventCertificate:
		return "certificate request"
	case e.Event == EventRotation && e.Decision == DecisionRefused:
		return "root rotation step refused"
	case e.Event == EventRotation:
		return "root rotation step"
	case e.Event == EventConfig:
		return "configuration loaded"
	case e.Event == EventIntermediate && e.Decision == DecisionRefused:
		return "intermediate renewal failed"
	case e.Event == EventIntermediate:
		return "intermediate issued"
	case e.Event == EventRevocation && e.Decision == DecisionRefused:
		return "revocation refused"
	case e.Event == EventRevocation:
		return "revocation"
	case e.Event == EventCRL && e.Decision == DecisionRefused:
		return "CRL not issued"
	case e.Event == EventCRL:
		return "CRL issued"
	}
	return "audit"
}

// attrs lays the event out in a fixed order, leaving zero fields out.
func (e *AuditEvent) attrs(host string) []slog.Attr {
	a := make([]slog.Attr, 0, 26) // every field of a certificate event, in one allocation
	a = append(a, slog.Bool(logAudit, true), slog.String(logEvent, e.Event), slog.String(logDecision, e.Decision))
	str := func(key, v string) {
		if v != "" {
			a = append(a, slog.String(key, v))
		}
	}
	str(logRequestID, e.RequestID)
	str(logHost, host)
	str(logCaller, e.Caller)
	str(logMethod, e.Authn)
	str(logPod, e.Pod)
	str(logNode, e.Node)
	str(logPeer, e.Peer)
	str(logCluster, e.Cluster)
	str(logRequested, e.Requested)
	str(logIdentity, e.Identity)
	str(logCode, e.Code)
	str(logReason, e.Reason)
	str(logDetail, e.Detail)
	str(logSerial, e.Serial)
	if !e.NotAfter.IsZero() {
		a = append(a, slog.Time(logNotAfter, e.NotAfter.UTC()))
	}
	str(logBackend, e.Backend)
	if e.Latency != 0 {
		a = append(a, slog.Duration(logLatency, e.Latency))
	}
	str(logIssuer, e.Issuer)
	str(logProxyNode, e.ProxyNode)
	str(logVerb, e.Verb)
	str(logAuthority, e.Authority)
	str(logUpstream, e.Upstream)
	str(logReplaced, e.Replaced)
	if e.Event == EventCRL && e.CRLNumber != "" { // a CRL was made: 0 entries is a fact
		a = append(a, slog.String(logCRLNumber, e.CRLNumber), slog.Int(logEntries, e.Entries))
	}
	if e.Event == EventRotation {
		a = append(a, slog.Bool(logForced, e.Forced))
	}
	str(logSource, e.Source)
	str(logVersion, e.Version)
	str(logConfigFile, e.ConfigFile)
	if len(e.Settings) > 0 {
		a = append(a, slog.Any(logSettings, e.Settings))
	}
	if len(e.IgnoredEnv) > 0 {
		a = append(a, slog.Any(logIgnoredEnv, e.IgnoredEnv))
	}
	return a
}

// finish records the one audit event and the metrics of a request and
// returns the status the client receives. The detail of a refusal is
// audited, never sent; tokens and keys never reach either.
func (s *Server) finish(ctx context.Context, r *request, err error, start time.Time) error {
	o := classify(err)
	sendRequestID(ctx, r.id, o.RetryAfter > 0)
	limit.SetRetryPushback(ctx, o.RetryAfter)
	now := s.c.Now()
	elapsed := now.Sub(start)
	s.c.Metrics.observe(o, elapsed)
	e := &AuditEvent{Time: now, Event: EventCertificate, Decision: DecisionIssued, RequestID: r.id,
		Peer: r.peer, Cluster: r.creds.ClusterID, Requested: r.requested,
		Code: o.Code.String(), Reason: o.Reason, Backend: s.c.SignerName, Latency: elapsed}
	if c := r.caller; c != nil {
		e.Caller, e.Authn, e.Node = c.ID.String(), c.Method, c.Node
		if c.PodName != "" {
			e.Pod = c.Namespace + "/" + c.PodName
		}
	}
	if !r.identity.IsZero() {
		e.Identity = r.identity.String()
	}
	if o.Code != codes.OK {
		e.Decision, e.Detail = DecisionDenied, o.Detail
	}
	if r.leaf != nil {
		e.Serial, e.NotAfter, e.Issuer = r.leaf.SerialNumber.Text(16), r.leaf.NotAfter, r.issuer
	}
	e.ProxyNode = r.proxyNode
	s.c.Audit.Audit(ctx, e)
	if o.Code == codes.Internal {
		s.c.Logger.ErrorContext(ctx, "certificate request failed inside the CA", logRequestID, r.id, logReason, o.Reason, logDetail, o.Detail)
	}
	return o.Status()
}
