package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// revokeCmd runs `meshca revoke args...` with stdin and returns its
// output (standard output and error) and exit code.
func revokeCmd(t *testing.T, stdin string, args ...string) (string, int) {
	t.Helper()
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(append([]string{"revoke"}, args...))
	err := cmd.ExecuteContext(context.Background())
	if err != nil {
		out.WriteString(err.Error())
		return out.String(), exitCode(err)
	}
	return out.String(), 0
}

// revokeState is a CA state directory with two authorities under one
// root, each signing with an intermediate: active and prepared, and a
// third, prepared, that signs with its own root.
type revokeState struct {
	dir                       string
	root, active, prepared    *testca.CA
	activeID, preparedID, own string
	selfID, selfSubject       string
}

func newRevokeState(t *testing.T) *revokeState {
	t.Helper()
	s := &revokeState{dir: filepath.Join(t.TempDir(), "state")}
	s.root = testca.NewRoot(t, "revoke root", testca.Options{})
	s.active = s.root.NewIntermediate(t, "revoke active", testca.Options{})
	s.prepared = s.root.NewIntermediate(t, "revoke prepared", testca.Options{})
	for _, ca := range []*testca.CA{s.active, s.prepared} {
		cadir := t.TempDir()
		ca.WriteCACerts(t, cadir)
		if out, code := rootCmd(t, "prepare", "--state-dir="+s.dir, "--ca-dir", cadir); code != 0 {
			t.Fatalf("prepare: exit %d\n%s", code, out)
		}
	}
	if out, code := rootCmd(t, "prepare", "--state-dir="+s.dir); code != 0 {
		t.Fatalf("prepare: exit %d\n%s", code, out)
	}
	// An intermediate under a root whose key the state holds: the one
	// meshca can revoke, since it signs that root's CRL.
	if out, code := rootCmd(t, "prepare", "--state-dir="+s.dir, "--upstream", "self", "--trust-domain", "cluster.local"); code != 0 {
		t.Fatalf("prepare --upstream self: exit %d\n%s", code, out)
	}
	st := s.load(t)
	s.activeID, s.preparedID, s.own = keymgr.Fingerprint(s.active.Cert), keymgr.Fingerprint(s.prepared.Cert), st.Authorities[2].ID()
	s.selfID, s.selfSubject = st.Authorities[3].ID(), st.Authorities[3].Cert.Subject.String()
	return s
}

func (s *revokeState) load(t *testing.T) *keymgr.State {
	t.Helper()
	st, _, err := (&dirstore.Store{Dir: s.dir}).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// issuedLine is one issued certificate event as ca.AuditLog writes it.
func issuedLine(serial, issuer, node, proxyNode, identity string, at, notAfter time.Time) string {
	extra := ""
	if issuer != "" {
		extra += fmt.Sprintf(`,"issuer":%q`, issuer)
	}
	if proxyNode != "" {
		extra += fmt.Sprintf(`,"proxy_node":%q,"requested":%q`, proxyNode, identity)
	}
	return fmt.Sprintf(`{"time":%q,"level":"INFO","msg":"certificate request","audit":true,"event":"certificate","decision":"issued","node":%q,"identity":%q,"serial":%q,"not_after":%q%s}`,
		at.Format(time.RFC3339Nano), node, identity, serial, notAfter.Format(time.RFC3339), extra)
}

// TestRevokeCLI: every way of asking, each with its exit code and a
// message that says what to do; what is refused changes nothing.
func TestRevokeCLI(t *testing.T) {
	s := newRevokeState(t)
	now := time.Now()
	day := now.Add(24 * time.Hour)
	log := strings.Join([]string{
		issuedLine("9c1e0a", s.activeID, "node-a", "node-a", "spiffe://cluster.local/ns/shop/sa/cart", now.Add(-time.Hour), day),
		"not JSON: a line of another log",
		issuedLine("bee5", "", "node-a", "", "spiffe://cluster.local/ns/shop/sa/own", now.Add(-time.Hour), day),
		// An older meshca: no issuer, no proxy_node; impersonated.
		issuedLine("12345", "", "node-a", "", "spiffe://cluster.local/ns/shop/sa/db", now.Add(-time.Hour), day),
		issuedLine("c0ffee", s.activeID, "node-a", "node-a", "spiffe://cluster.local/ns/shop/sa/old", now.Add(-48*time.Hour), day),
		issuedLine("dead", s.activeID, "node-a", "node-a", "spiffe://cluster.local/ns/shop/sa/expired", now.Add(-time.Hour), now.Add(-time.Minute)),
		issuedLine("f00d", s.activeID, "node-b", "node-b", "spiffe://cluster.local/ns/shop/sa/web", now.Add(-time.Hour), day),
		// A pod certificate the kubelet of node-a asked for.
		strings.Replace(issuedLine("beef", "", "node-a", "", "spiffe://cluster.local/ns/shop/sa/pod", now.Add(-time.Hour), day),
			`"event":"certificate"`, `"event":"pod_certificate"`, 1),
	}, "\n") + "\n"
	// The older meshca's impersonated event.
	log = strings.Replace(log, `"serial":"12345"`, `"requested":"spiffe://cluster.local/ns/shop/sa/db","serial":"12345"`, 1)
	logFile := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(logFile, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	st := "--state-dir=" + s.dir
	steps := []struct {
		name  string
		stdin string
		args  []string
		code  int
		want  []string
		// revoked and blocked: the state's afterwards.
		revoked, blocked int
	}{
		{name: "nothing to revoke", args: []string{st}, code: 2, want: []string{"give exactly one of --serial, --intermediate and --node"}},
		{name: "no reason", args: []string{st, "--serial", "9c1e0a", "--audit-log", logFile}, code: 2, want: []string{"--reason is required"}},
		{name: "caCompromise of a leaf", args: []string{st, "--serial", "9c1e0a", "--audit-log", logFile, "--reason", "caCompromise"}, code: 2,
			want: []string{"reason of a CA certificate"}},
		{name: "serial without the log", args: []string{st, "--serial", "9c1e0a", "--reason", "keyCompromise"}, code: 2,
			want: []string{"--serial needs --audit-log", "or --issuer and --not-after"}},
		{name: "serial meshca never issued", args: []string{st, "--serial", "0x77", "--reason", "keyCompromise", "--audit-log", logFile}, code: 3,
			want: []string{"meshca has no record of issuing serial 77 in " + logFile, "give the certificate's --issuer and --not-after", "lines 2)"}},
		{name: "dry run", args: []string{st, "--serial", "9C:1E:0A", "--reason", "keyCompromise", "--audit-log", logFile, "--dry-run"},
			want: []string{"SERIAL", "9c1e0a", "shop/sa/cart", s.activeID[:16], "dry run: 1 certificate(s) to revoke; nothing changed"}},
		{name: "serial from the log", args: []string{st, "--serial", "9c1e0a", "--reason", "keyCompromise", "--audit-log", logFile},
			want: []string{"revoked 1 certificate(s)", "1 of 8 lines could not be read"}, revoked: 1},
		{name: "serial again", args: []string{st, "--serial", "9c1e0a", "--reason", "keyCompromise", "--audit-log", logFile},
			want: []string{"revoked 0 certificate(s) (1 already revoked or expired)"}, revoked: 1},
		{name: "serial by --issuer and --not-after", args: []string{st, "--serial", "abc", "--reason", "superseded", "--issuer", s.preparedID[:12],
			"--not-after", day.UTC().Format(time.RFC3339)}, want: []string{"revoked 1 certificate(s)"}, revoked: 2},
		{name: "--issuer that is no CA", args: []string{st, "--serial", "abd", "--reason", "superseded", "--issuer", "0123456789abcdef",
			"--not-after", day.UTC().Format(time.RFC3339)}, code: 1, want: []string{"no CA of the CA state that is not retired has this id"}, revoked: 2},
		{name: "undo a serial", args: []string{st, "--serial", "hex:abc", "--undo"}, want: []string{"took back 1 revocation(s)"}, revoked: 1},
		{name: "undo it again", args: []string{st, "--serial", "abc", "--undo"}, code: 1, want: []string{"not revoked: serial abc"}, revoked: 1},
		{name: "the root of an authority", args: []string{st, "--intermediate", s.own[:16], "--reason", "caCompromise"}, code: 1,
			want: []string{"signs with its root: no CRL revokes a root"}, revoked: 1},
		{name: "the active intermediate", args: []string{st, "--intermediate", s.activeID[:16], "--reason", "caCompromise"}, code: 1,
			want: []string{"is the active one", "give --force"}, revoked: 1},
		{name: "an imported intermediate whose root's key meshca lacks", args: []string{st, "--intermediate", s.preparedID[:16], "--reason", "caCompromise"},
			code: 1, want: []string{"meshca cannot publish a CRL of", "CN=revoke root", "its CRL must come from where its key is"}, revoked: 1},
		{name: "a prepared intermediate", args: []string{st, "--intermediate", s.selfID[:16], "--reason", "caCompromise"},
			want: []string{"revoked 1 certificate(s)", s.selfSubject}, revoked: 2},
		{name: "undo the intermediate", args: []string{st, "--intermediate", s.selfID[:16], "--undo"}, want: []string{"took back 1"}, revoked: 1},
		{name: "node without --since", args: []string{st, "--node", "node-a", "--reason", "keyCompromise", "--audit-log", logFile}, code: 2,
			want: []string{"--node needs --since"}, revoked: 1},
		{name: "unknown node", args: []string{st, "--node", "node-z", "--since", "24h", "--reason", "keyCompromise", "--audit-log", logFile}, code: 3,
			want: []string{`meshca has no record of node "node-z"`, "nothing changed"}, revoked: 1},
		{name: "node, dry run, log on stdin", stdin: log, args: []string{st, "--node", "node-a", "--since", "24h", "--reason", "keyCompromise", "--audit-log", "-", "--dry-run"},
			want: []string{"9c1e0a", "bee5", "12345", "beef", "(any: not recorded)", "4 certificate(s) to revoke", "standard input: 1 of 8 lines"}, revoked: 1},
		{name: "node", args: []string{st, "--node", "node-a", "--since", now.Add(-24 * time.Hour).UTC().Format(time.RFC3339), "--reason", "keyCompromise", "--audit-log", logFile},
			want: []string{"revoked 3 certificate(s) (1 already revoked or expired)", "node node-a blocked"}, revoked: 4, blocked: 1},
		{name: "unblock", args: []string{st, "--node", "node-a", "--undo"}, want: []string{"node node-a unblocked", "stays revoked"}, revoked: 4},
		{name: "unblock again", args: []string{st, "--node", "node-a", "--undo"}, code: 1, want: []string{"the node is not blocked"}, revoked: 4},
	}
	for _, step := range steps {
		out, code := revokeCmd(t, step.stdin, step.args...)
		if code != step.code {
			t.Fatalf("%s: exit %d, want %d:\n%s", step.name, code, step.code, out)
		}
		for _, w := range step.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", step.name, w, out)
			}
		}
		if got := s.load(t); len(got.Revocations) != step.revoked || len(got.Blocked) != step.blocked {
			t.Errorf("%s: %d revocations and %d blocks, want %d and %d", step.name, len(got.Revocations), len(got.Blocked), step.revoked, step.blocked)
		}
	}
}
