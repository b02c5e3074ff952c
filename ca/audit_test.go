package ca_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// recorder is an AuditSink that keeps the events.
type recorder struct {
	mu     sync.Mutex
	events []ca.AuditEvent
}

func (r *recorder) Audit(_ context.Context, e *ca.AuditEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, *e)
}

func (r *recorder) last(t *testing.T) ca.AuditEvent {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.events) == 0 {
		t.Fatal("no audit event")
	}
	return r.events[len(r.events)-1]
}

// podToken authenticates "pod-token" as the frontend Pod on node-a.
type podToken struct{}

func (podToken) Authenticate(_ context.Context, c *ca.Credentials) (*ca.Caller, error) {
	if c.Token != "pod-token" {
		return nil, ca.ErrNoCredentials
	}
	return &ca.Caller{ID: frontend, Namespace: "prod", ServiceAccount: "frontend", PodName: "frontend-0", Node: "node-a", Method: "token"}, nil
}

// call sends one CreateCertificate for id with the given headers and
// returns the status and the response header.
func call(t *testing.T, f *fixture, md metadata.MD, id spiffeid.ID, impersonate string) (*authpb.IstioCertificateResponse, metadata.MD, error) {
	t.Helper()
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: f.roots, ServerName: "istiod.istio-system.svc"})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := csr.Build(key, id)
	if err != nil {
		t.Fatal(err)
	}
	req := &authpb.IstioCertificateRequest{Csr: string(pem), ValidityDuration: 3600}
	if impersonate != "" {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{authpb.MetaImpersonatedIdentity: structpb.NewStringValue(impersonate)}}
	}
	var header metadata.MD
	resp, err := authpb.NewIstioCertificateServiceClient(conn).CreateCertificate(metadata.NewOutgoingContext(context.Background(), md), req, grpc.Header(&header))
	return resp, header, err
}

var hexID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestAuditEvents: one event per request, issued or denied, naming the
// caller, its Pod, what it asked for, the decision and why, the serial
// and NotAfter of what was issued, the backend, the cluster and the
// request id, which the client may send and always gets back.
func TestAuditEvents(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	rec := &recorder{}
	f := newFixture(t, root.Authority(), options{authn: podToken{}, config: func(c *ca.Config) { c.Audit = rec }})
	backend := spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/backend")
	tests := []struct {
		name        string
		md          metadata.MD
		id          spiffeid.ID
		impersonate string
		code        codes.Code
		msg         string
		want        ca.AuditEvent
	}{
		{name: "issued", md: metadata.Pairs("authorization", "Bearer pod-token", "clusterid", "Kubernetes", "x-request-id", "ztunnel-7f3a"),
			id: frontend, code: codes.OK,
			want: ca.AuditEvent{Event: ca.EventCertificate, Decision: ca.DecisionIssued, RequestID: "ztunnel-7f3a",
				Caller: frontend.String(), Authn: "token", Pod: "prod/frontend-0", Node: "node-a", Cluster: "Kubernetes",
				Identity: frontend.String(), Code: "OK", Reason: "ok", Backend: "local", Issuer: keymgr.Fingerprint(root.Cert)}},
		{name: "denied: bad token", md: metadata.Pairs("authorization", "Bearer who-knows", "clusterid", "Kubernetes"),
			id: frontend, code: codes.Unauthenticated, msg: "bad token",
			want: ca.AuditEvent{Event: ca.EventCertificate, Decision: ca.DecisionDenied, Cluster: "Kubernetes",
				Code: "Unauthenticated", Reason: "test_bad_token", Detail: "ca: test_bad_token: bad token", Backend: "local"}},
		{name: "denied: impersonation by a workload", md: metadata.Pairs("authorization", "Bearer pod-token", "x-request-id", "has space"),
			id: backend, impersonate: backend.String(), code: codes.PermissionDenied, msg: "may not request other identities",
			want: ca.AuditEvent{Event: ca.EventCertificate, Decision: ca.DecisionDenied,
				Caller: frontend.String(), Authn: "token", Pod: "prod/frontend-0", Node: "node-a", Requested: backend.String(),
				Code: "PermissionDenied", Reason: "untrusted_caller", Backend: "local"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, header, err := call(t, f, tt.md, tt.id, tt.impersonate)
			if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("err = %v, want %v %q", err, tt.code, tt.msg)
			}
			got := rec.last(t)
			if tt.want.RequestID == "" && !hexID.MatchString(got.RequestID) {
				t.Errorf("request id %q, want 32 hex digits", got.RequestID)
			}
			if h := header.Get(ca.RequestIDHeader); len(h) != 1 || h[0] != got.RequestID {
				t.Errorf("response header x-request-id %q, audited %q", h, got.RequestID)
			}
			if got.Time.IsZero() || got.Latency <= 0 || !strings.HasPrefix(got.Peer, "127.0.0.1:") {
				t.Errorf("time %v latency %v peer %q", got.Time, got.Latency, got.Peer)
			}
			if tt.code == codes.OK {
				leaf, err := pemutil.ParseCertificates([]byte(resp.GetCertChain()[0]))
				if err != nil {
					t.Fatal(err)
				}
				if got.Serial != leaf[0].SerialNumber.Text(16) || !got.NotAfter.Equal(leaf[0].NotAfter) {
					t.Errorf("serial %s not after %v, want the leaf's %s %v", got.Serial, got.NotAfter, leaf[0].SerialNumber.Text(16), leaf[0].NotAfter)
				}
			} else if got.Serial != "" || !got.NotAfter.IsZero() || !strings.Contains(got.Detail, tt.want.Detail) {
				t.Errorf("denied: serial %q not after %v detail %q", got.Serial, got.NotAfter, got.Detail)
			}
			if tt.want.RequestID == "" {
				tt.want.RequestID = got.RequestID
			}
			got.Time, got.Latency, got.Peer, got.Serial, got.NotAfter, got.Detail = time.Time{}, 0, "", "", time.Time{}, ""
			tt.want.Detail = ""
			if gj, wj := mustJSON(t, got), mustJSON(t, tt.want); gj != wj {
				t.Errorf("event\n got %s\nwant %s", gj, wj)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAuditLogFormat: AuditLog writes one JSON object per event with
// the documented keys, leaves zero fields out, and never sees a token:
// the server's events of an issued and a refused request, written by it.
func TestAuditLogFormat(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	var out syncBuffer
	f := newFixture(t, root.Authority(), options{authn: podToken{}, config: func(c *ca.Config) { c.Audit = ca.NewAuditLog(&out) }})
	if _, _, err := call(t, f, metadata.Pairs("authorization", "Bearer pod-token"), frontend, ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := call(t, f, metadata.Pairs("authorization", "Bearer who-knows"), frontend, ""); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("err = %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), out.String())
	}
	wantKeys := [][]string{
		{"time", "level", "msg", "audit", "event", "decision", "request_id", "host", "caller", "authn", "pod", "node", "peer",
			"identity", "code", "reason", "serial", "not_after", "backend", "latency", "issuer"},
		{"time", "level", "msg", "audit", "event", "decision", "request_id", "host", "peer", "code", "reason", "detail", "backend", "latency"},
	}
	for i, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %d is not JSON: %v\n%s", i, err, line)
		}
		if keys := jsonKeys(t, line); strings.Join(keys, ",") != strings.Join(wantKeys[i], ",") {
			t.Errorf("line %d keys\n got %v\nwant %v", i, keys, wantKeys[i])
		}
		if m["audit"] != true || m["msg"] != "certificate request" || !strings.HasSuffix(m["time"].(string), "Z") {
			t.Errorf("line %d: %s", i, line)
		}
	}
	if !strings.Contains(lines[0], `"level":"INFO"`) || !strings.Contains(lines[1], `"level":"WARN"`) {
		t.Errorf("levels:\n%s", out.String())
	}
	for _, tok := range []string{"pod-token", "who-knows", "BEGIN"} {
		if strings.Contains(out.String(), tok) {
			t.Errorf("%q reached the audit log", tok)
		}
	}
}

// TestAuditCRLFormat: a CRL event, issued or refused, has its message,
// level and keys; the number of entries is written even when 0.
func TestAuditCRLFormat(t *testing.T) {
	next := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		e       ca.AuditEvent
		msg     string
		level   string
		keys    string
		contain string
	}{
		{e: ca.AuditEvent{Event: ca.EventCRL, Decision: ca.DecisionIssued, Source: ca.SourceAuto, Caller: "meshca", Issuer: "5ec9ba02",
			CRLNumber: "7", Entries: 0, NotAfter: next, Reason: "the revocations changed"},
			msg: "CRL issued", level: "INFO", keys: "time,level,msg,audit,event,decision,host,caller,reason,not_after,issuer,crl_number,entries,source",
			contain: `"crl_number":"7","entries":0`},
		{e: ca.AuditEvent{Event: ca.EventCRL, Decision: ca.DecisionRefused, Source: ca.SourceAuto, Caller: "meshca", Issuer: "5ec9ba02",
			Detail: "keymgr: CRL of 5ec9ba02: sign: token removed"},
			msg: "CRL not issued", level: "WARN", keys: "time,level,msg,audit,event,decision,host,caller,detail,issuer,source",
			contain: `"detail":"keymgr: CRL of 5ec9ba02: sign: token removed"`},
	} {
		var out syncBuffer
		ca.NewAuditLog(&out).Audit(t.Context(), &tc.e)
		line := strings.TrimSpace(out.String())
		if keys := strings.Join(jsonKeys(t, line), ","); keys != tc.keys {
			t.Errorf("%s: keys\n got %s\nwant %s", tc.msg, keys, tc.keys)
		}
		for _, want := range []string{`"msg":"` + tc.msg + `"`, `"level":"` + tc.level + `"`, `"event":"crl"`, tc.contain} {
			if !strings.Contains(line, want) {
				t.Errorf("%s: %s lacks %s", tc.msg, line, want)
			}
		}
	}
}

// jsonKeys lists the keys of a JSON object in their order.
func jsonKeys(t *testing.T, line string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}
