package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
)

// auditRecord is an audit line as written.
type auditRecord struct {
	Time      time.Time `json:"time"`
	Level     string    `json:"level"`
	Msg       string    `json:"msg"`
	Audit     bool      `json:"audit"`
	Event     string    `json:"event"`
	Decision  string    `json:"decision"`
	RequestID string    `json:"request_id"`
	Host      string    `json:"host"`
	Caller    string    `json:"caller"`
	Reason    string    `json:"reason"`
	Detail    string    `json:"detail"`
	Backend   string    `json:"backend"`
	Verb      string    `json:"verb"`
	Authority string    `json:"authority"`
	Forced    *bool     `json:"forced"`
	Source    string    `json:"source"`
	Version   string    `json:"version"`
	Config    string    `json:"config_file"`
	Settings  map[string]struct {
		Value  any    `json:"value"`
		Source string `json:"source"`
	} `json:"settings"`
	IgnoredEnv []string `json:"ignored_env"`
}

// auditRecords parses the audit lines of out, skipping other lines.
func auditRecords(t *testing.T, out []byte) []auditRecord {
	t.Helper()
	var recs []auditRecord
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r auditRecord
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Audit {
			recs = append(recs, r)
		}
	}
	return recs
}

// TestRootStepAudit: each `meshca root` step writes one event in the
// server's format to --audit-log-file: taken, refused by its guard, and
// forced with the operator's reason.
func TestRootStepAudit(t *testing.T) {
	dir := t.TempDir()
	st, log := "--state-dir="+filepath.Join(dir, "state"), filepath.Join(dir, "audit.log")
	t.Setenv("POD_NAMESPACE", "istio-system")
	t.Setenv("POD_NAME", "meshca-rotate-29000000-x")
	steps := []struct {
		args     []string
		code     int
		decision string
		forced   bool
		reason   string
		detail   string
	}{
		{args: []string{"prepare", st, "--reason", "first root"}, decision: ca.DecisionTaken, reason: "first root"},
		{args: []string{"prepare", st}, decision: ca.DecisionTaken},
		{args: []string{"activate", st}, code: 1, decision: ca.DecisionRefused, detail: "safe at"},
		{args: []string{"activate", st, "--force", "--reason", "compromise drill"}, decision: ca.DecisionForced, forced: true, reason: "compromise drill"},
	}
	for i, s := range steps {
		if i == 2 {
			recordLeaf(t, filepath.Join(dir, "state"), 24*time.Hour)
		}
		out, code := rootCmd(t, append(s.args, "--audit-log-file", log)...)
		if code != s.code {
			t.Fatalf("%v: exit %d, want %d:\n%s", s.args, code, s.code, out)
		}
		if strings.Contains(out, `"audit":true`) {
			t.Fatalf("%v: the audit event went to standard error too:\n%s", s.args, out)
		}
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(log); err != nil || fi.Mode().Perm() != auditFileMode {
		t.Fatalf("audit log mode %v, err %v; want %v", fi.Mode().Perm(), err, os.FileMode(auditFileMode))
	}
	recs := auditRecords(t, data)
	if len(recs) != len(steps) {
		t.Fatalf("%d audit events, want %d:\n%s", len(recs), len(steps), data)
	}
	for i, s := range steps {
		r := recs[i]
		verb := s.args[0]
		switch {
		case r.Event != ca.EventRotation || r.Decision != s.decision || r.Verb != verb || r.Source != ca.SourceCLI:
			t.Errorf("%v: event %s/%s verb %s source %s", s.args, r.Event, r.Decision, r.Verb, r.Source)
		case r.Forced == nil || *r.Forced != s.forced || r.Reason != s.reason || !strings.Contains(r.Detail, s.detail):
			t.Errorf("%v: forced %v reason %q detail %q", s.args, r.Forced, r.Reason, r.Detail)
		case len(r.Authority) != 64 || r.Backend != "local" || r.Caller == "" || len(r.RequestID) != 32:
			t.Errorf("%v: authority %q backend %q caller %q request id %q", s.args, r.Authority, r.Backend, r.Caller, r.RequestID)
		case r.Time.IsZero() || time.Since(r.Time) > time.Minute:
			t.Errorf("%v: time %v", s.args, r.Time)
		}
		if !strings.Contains(string(data), `"pod":"istio-system/meshca-rotate-29000000-x"`) {
			t.Error("no event names the Pod the CLI ran in")
		}
	}
	if recs[2].Level != "WARN" || recs[3].Level != "WARN" || recs[0].Level != "INFO" {
		t.Errorf("levels %s %s %s", recs[0].Level, recs[2].Level, recs[3].Level)
	}
	if out, code := rootCmd(t, "prepare", st, "--audit-log-file", filepath.Join(dir, "missing", "audit.log")); code != 2 || !strings.Contains(out, "--audit-log-file") {
		t.Fatalf("unwritable audit log: exit %d, want 2 before the step:\n%s", code, out)
	}
}

// TestAuditFileReopen: after the file is moved away, Reopen starts a new
// one at the path, created 0600; nothing is lost.
func TestAuditFileReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	f, err := openAuditFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	log := ca.NewAuditLog(f)
	log.Audit(context.Background(), &ca.AuditEvent{Event: ca.EventConfig, Decision: ca.DecisionLoaded, Message: "one"})
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	log.Audit(context.Background(), &ca.AuditEvent{Event: ca.EventConfig, Decision: ca.DecisionLoaded, Message: "two"})
	if err := f.Reopen(); err != nil {
		t.Fatal(err)
	}
	log.Audit(context.Background(), &ca.AuditEvent{Event: ca.EventConfig, Decision: ca.DecisionLoaded, Message: "three"})
	for file, want := range map[string][]string{path + ".1": {"one", "two"}, path: {"three"}} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		recs := auditRecords(t, data)
		if len(recs) != len(want) {
			t.Fatalf("%s: %d events, want %v:\n%s", file, len(recs), want, data)
		}
		for i, w := range want {
			if recs[i].Msg != w {
				t.Errorf("%s: event %d is %q, want %q", file, i, recs[i].Msg, w)
			}
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != auditFileMode {
		t.Fatalf("new file mode %v, err %v", fi.Mode().Perm(), err)
	}
}

// TestServeConfigEvent: serve writes one configuration event at start,
// before it assembles anything: every setting with its source, secrets
// redacted, the config file and the unknown MESHCA_ variables.
func TestServeConfigEvent(t *testing.T) {
	withoutMeshcaEnv(t)
	dir := t.TempDir()
	file := writeConfig(t, "defaultTTL: 12h\nvault:\n  appRoleRoleID: 9f1e2d3c-role\n")
	t.Setenv("MESHCA_MAX_TTL", "720h")
	t.Setenv("TRUST_DOMAIN", "example.org")
	t.Setenv("CA_TRUSTED_NODE_ACCOUNTS", "istio-system/ztunnel,kube-system/node-proxy")
	t.Setenv("MESHCA_CFSSL_URL", "https://meshca:hunter2@cfssl.pki.svc:8888")
	t.Setenv("MESHCA_CFSSL_LABEL", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl")
	t.Setenv("MESHCA_TRUST_DOMAN", "typo.org")
	cmd := newRootCommand()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"serve", "--config", file, "--cluster-id", "east", "--state-dir", filepath.Join(dir, "state"),
		"--kubeconfig", filepath.Join(dir, "missing-kubeconfig"), "--listen", "127.0.0.1:0", "--admin-listen", ""})
	if err := cmd.ExecuteContext(context.Background()); err == nil {
		t.Fatal("serve started without a kubeconfig")
	}
	recs := auditRecords(t, stdout.Bytes())
	if len(recs) != 1 {
		t.Fatalf("%d audit events, want the configuration's:\n%s", len(recs), stdout.String())
	}
	r := recs[0]
	if r.Event != ca.EventConfig || r.Decision != ca.DecisionLoaded || r.Msg != "configuration loaded" || r.Version != version || r.Config != file {
		t.Fatalf("event %+v", r)
	}
	want := map[string]struct {
		value  any
		source string
	}{
		"cluster-id":            {"east", "flag"},
		"default-ttl":           {"12h0m0s", "config"},
		"max-ttl":               {"720h0m0s", "env MESHCA_MAX_TTL"},
		"trust-domain":          {"example.org", "env TRUST_DOMAIN"},
		"trusted-node-accounts": {[]any{"istio-system/ztunnel", "kube-system/node-proxy"}, "env CA_TRUSTED_NODE_ACCOUNTS"},
		"token-audiences":       {[]any{"istio-ca"}, "default"},
		"vault-approle-role-id": {"[redacted]", "config"},
		"cfssl-url":             {"https://meshca:xxxxx@cfssl.pki.svc:8888", "env MESHCA_CFSSL_URL"},
		"cfssl-label":           {"[redacted]", "env MESHCA_CFSSL_LABEL"},
		"config":                {file, "flag"},
	}
	for name, w := range want {
		got, ok := r.Settings[name]
		if !ok {
			t.Errorf("no setting %s", name)
			continue
		}
		gv, _ := json.Marshal(got.Value)
		wv, _ := json.Marshal(w.value)
		if string(gv) != string(wv) || got.Source != w.source {
			t.Errorf("%s = %s from %q, want %s from %q", name, gv, got.Source, wv, w.source)
		}
	}
	if len(r.IgnoredEnv) != 1 || r.IgnoredEnv[0] != "MESHCA_TRUST_DOMAN" {
		t.Errorf("ignored_env %q", r.IgnoredEnv)
	}
	for _, secret := range []string{"hunter2", "9f1e2d3c-role", "eyJhbGciOiJSUzI1NiJ9"} {
		if strings.Contains(stdout.String()+stderr.String(), secret) {
			t.Errorf("%q leaked:\n%s", secret, stdout.String())
		}
	}
}

func TestRedact(t *testing.T) {
	tests := []struct{ flag, value, want string }{
		{"trust-domain", "cluster.local", "cluster.local"},
		{"vault-token-file", "/var/run/secrets/vault/token-0123456789abcdef0123", "/var/run/secrets/vault/token-0123456789abcdef0123"},
		{"serving-dns-names", "istiod.istio-system.svc", "istiod.istio-system.svc"},
		{"state-secret", "istio-system/meshca-ca-state", "istio-system/meshca-ca-state"},
		{"bundle-endpoint-spiffe-id", "spiffe://cluster.local/ns/istio-system/sa/meshca", "spiffe://cluster.local/ns/istio-system/sa/meshca"},
		{"vault-approle-role-id", "db02de05-fa39-4855-059b-67221c5c2f63", "[redacted]"},
		{"cfssl-label", "0123456789abcdef0123456789abcdef", "[redacted]"},
		{"vault-role", "hvs.CAESIJlWh0kq6vEeT3c2Y6pNHSvJpEGqv0", "[redacted]"},
		{"cfssl-profile", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln", "[redacted]"},
		{"trust-anchors", "-----BEGIN CERTIFICATE-----", "[redacted]"},
		{"vault-addr", "https://admin:pw@vault:8200", "https://admin:xxxxx@vault:8200"},
		{"vault-addr", "https://vault.vault.svc:8200", "https://vault.vault.svc:8200"},
		{"key-policy", "ecdsa-p256,ecdsa-p384,ed25519,rsa-2048-8192", "ecdsa-p256,ecdsa-p384,ed25519,rsa-2048-8192"},
	}
	for _, tt := range tests {
		if got := redact(tt.flag, tt.value); got != tt.want {
			t.Errorf("redact(%s, %q) = %q, want %q", tt.flag, tt.value, got, tt.want)
		}
	}
}

// withoutMeshcaEnv unsets, for the test, the MESHCA_ variables of the
// environment it runs in (a developer's own settings, the test targets'
// knobs), so that what serve reads from the environment is the test's.
func withoutMeshcaEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "MESHCA_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}
