package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// auditEvent is one line of meshca's audit log, as documented in the
// README.
type auditEvent struct {
	Time      time.Time `json:"time"`
	Msg       string    `json:"msg"`
	Audit     bool      `json:"audit"`
	Event     string    `json:"event"`
	Decision  string    `json:"decision"`
	RequestID string    `json:"request_id"`
	Host      string    `json:"host"`
	Caller    string    `json:"caller"`
	Authn     string    `json:"authn"`
	Pod       string    `json:"pod"`
	Node      string    `json:"node"`
	Cluster   string    `json:"cluster"`
	Requested string    `json:"requested"`
	Identity  string    `json:"identity"`
	Code      string    `json:"code"`
	Reason    string    `json:"reason"`
	Detail    string    `json:"detail"`
	Serial    string    `json:"serial"`
	NotAfter  time.Time `json:"not_after"`
	Backend   string    `json:"backend"`
	Verb      string    `json:"verb"`
	Authority string    `json:"authority"`
	Forced    bool      `json:"forced"`
	Source    string    `json:"source"`
	Settings  map[string]struct {
		Value  any    `json:"value"`
		Source string `json:"source"`
	} `json:"settings"`
}

// readAudit waits until path holds n audit events and returns them.
func readAudit(t *testing.T, path string, n int) []auditEvent {
	t.Helper()
	var events []auditEvent
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		events = events[:0]
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var e auditEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil || !e.Audit {
				t.Fatalf("audit log line is not an audit event (%v): %s", err, sc.Text())
			}
			events = append(events, e)
		}
		if len(events) >= n || time.Now().After(deadline) {
			return events
		}
	}
}

var requestID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestAuditLog runs meshca with --audit-log-file and Istio's variables
// for its trusted node accounts and maximum TTL, and asserts the events
// of its start (the configuration and where each value came from), one
// issued request, one refused request and one `meshca root` step: all in
// the file, in one JSON format, none in the operational log, no token
// anywhere.
func TestAuditLog(t *testing.T) {
	system, apps := cluster.Namespace(t, "istio-system"), cluster.Namespace(t, "audit")
	t.Setenv("CA_TRUSTED_NODE_ACCOUNTS", system+"/ztunnel")
	t.Setenv("MAX_WORKLOAD_CERT_TTL", "48h")
	t.Setenv("MESHCA_DEFAULT_TTL", "12h")
	file := filepath.Join(t.TempDir(), "audit.log")
	s := startServer(t, "--audit-log-file", file, "--trusted-node-accounts", system+"/ztunnel,"+system+"/other")
	w := cluster.NewWorkload(t, apps, "reviews", "node-a")
	id := workloadID(w)
	svid, err := s.client(t, w.Token).Fetch(context.Background(), id, caclient.Options{TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// The workload asks for another identity: only node proxies may.
	other := cluster.NewWorkload(t, apps, "ratings", "node-a")
	_, err = s.client(t, w.Token).Fetch(context.Background(), workloadID(other), caclient.Options{Impersonate: true})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("impersonation by a workload: %v, want PermissionDenied", err)
	}
	if out, code := rootStep(t, "prepare", "--state-dir="+s.stateDir, "--reason", "e2e audit", "--audit-log-file", file); code != 0 {
		t.Fatalf("prepare: exit %d\n%s", code, out)
	}
	events := readAudit(t, file, 4)
	if len(events) != 4 {
		t.Fatalf("%d audit events, want 4 (configuration, issued, denied, rotation)", len(events))
	}
	config, issued, denied, step := events[0], events[1], events[2], events[3]

	if config.Event != "config" || config.Decision != "loaded" {
		t.Fatalf("first event %+v, want the configuration", config)
	}
	for name, want := range map[string]string{
		"trusted-node-accounts": "flag",
		"max-ttl":               "env MAX_WORKLOAD_CERT_TTL",
		"default-ttl":           "env MESHCA_DEFAULT_TTL",
		"audit-log-file":        "flag",
		"token-audiences":       "default",
	} {
		if got := config.Settings[name].Source; got != want {
			t.Errorf("setting %s from %q, want %q", name, got, want)
		}
	}
	if v := config.Settings["max-ttl"].Value; v != "48h0m0s" {
		t.Errorf("max-ttl %v, want 48h0m0s", v)
	}

	pod := w.Namespace + "/" + w.Pod
	switch e := issued; {
	case e.Event != "certificate" || e.Decision != "issued" || e.Code != "OK":
		t.Errorf("issued: %+v", e)
	case e.Caller != id.String() || e.Identity != id.String() || e.Authn != "token" || e.Pod != pod || e.Node != "node-a" || e.Cluster != "Kubernetes":
		t.Errorf("issued: who %+v", e)
	case e.Serial != svid.Chain[0].SerialNumber.Text(16) || !e.NotAfter.Equal(svid.Chain[0].NotAfter) || e.Backend != "local":
		t.Errorf("issued: serial %s not after %v backend %s; leaf %s %v", e.Serial, e.NotAfter, e.Backend, svid.Chain[0].SerialNumber.Text(16), svid.Chain[0].NotAfter)
	case !requestID.MatchString(e.RequestID) || e.Host == "":
		t.Errorf("issued: request id %q host %q", e.RequestID, e.Host)
	}
	switch e := denied; {
	case e.Event != "certificate" || e.Decision != "denied" || e.Code != "PermissionDenied" || e.Reason != "untrusted_caller":
		t.Errorf("denied: %+v", e)
	case e.Caller != id.String() || e.Pod != pod || e.Requested != workloadID(other).String() || e.Serial != "" || e.Detail == "":
		t.Errorf("denied: who and what %+v", e)
	case !requestID.MatchString(e.RequestID) || e.RequestID == issued.RequestID:
		t.Errorf("denied: request id %q (issued's %q)", e.RequestID, issued.RequestID)
	}
	switch e := step; {
	case e.Event != "rotation" || e.Decision != "taken" || e.Verb != "prepare" || e.Source != "cli" || e.Forced:
		t.Errorf("rotation: %+v", e)
	case e.Reason != "e2e audit" || len(e.Authority) != 64 || e.Backend != "local" || e.Caller == "":
		t.Errorf("rotation: reason %q authority %q backend %q caller %q", e.Reason, e.Authority, e.Backend, e.Caller)
	}

	data, _ := os.ReadFile(file)
	for _, tok := range []string{w.Token, other.Token} {
		if strings.Contains(string(data), tok) || strings.Contains(s.Logs(), tok) {
			t.Fatal("a token reached a log")
		}
	}
	if strings.Contains(s.Logs(), `"audit":true`) {
		t.Errorf("audit events in the operational log with --audit-log-file:\n%s", s.Logs())
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("audit log mode %v, err %v; want 0600", fi.Mode().Perm(), err)
	}
}

// TestAuditStdout: without --audit-log-file the events go to standard
// output, the operational log to standard error: a meshca that cannot
// reach its apiserver has written its configuration event to one and its
// refusal to the other.
func TestAuditStdout(t *testing.T) {
	cmd := exec.Command(bin, "serve", "--state-dir", filepath.Join(t.TempDir(), "state"), "--kubeconfig", filepath.Join(t.TempDir(), "none"),
		"--listen", "127.0.0.1:0", "--admin-listen", "", "--token-audiences", "istio-ca")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err == nil {
		t.Fatal("meshca served without a kubeconfig")
	}
	events := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var e auditEvent
	if len(events) != 1 || json.Unmarshal([]byte(events[0]), &e) != nil || e.Event != "config" || e.Settings["token-audiences"].Source != "flag" {
		t.Fatalf("standard output, want the configuration event alone:\n%s", stdout.String())
	}
	if strings.Contains(stderr.String(), `"audit":true`) || !strings.Contains(stderr.String(), "--kubeconfig") {
		t.Fatalf("standard error, want the operational log and the refusal only:\n%s", stderr.String())
	}
}
