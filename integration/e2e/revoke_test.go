package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// revokeCmd runs `meshca revoke args...` and returns its combined output
// and exit code.
func revokeCmd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"revoke"}, args...)...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// TestRevokeNode: against the real apiserver, meshca revoke --node finds
// in the audit log meshca wrote what was issued on node-a (through its
// ztunnel, and to a workload there by its own token), revokes it and
// blocks the node; the running server, which follows the CA state, then
// refuses node-a's ztunnel and that workload with a message naming the
// block, while node-b's ztunnel is served; --undo lifts the block. An unknown node and a serial
// meshca never issued are clear errors (exit 3) that change nothing.
func TestRevokeNode(t *testing.T) {
	file := t.TempDir() + "/audit.log"
	m := newMesh(t, "--audit-log-file", file)
	web := cluster.NewWorkload(t, m.apps, "web", "node-a")
	cluster.NewWorkload(t, m.apps, "db", "node-b")
	own := func() error { // web's sidecar, by its own token
		_, err := m.s.client(t, web.Token).Fetch(context.Background(), m.id("web"), caclient.Options{})
		return err
	}
	fetch := func(token, sa string) error {
		_, err := m.s.client(t, token).Fetch(context.Background(), m.id(sa), caclient.Options{Impersonate: true})
		return err
	}
	webSVID, err := m.s.client(t, m.ztunnelA.Token).Fetch(context.Background(), m.id("web"), caclient.Options{Impersonate: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := fetch(m.ztunnelB.Token, "db"); err != nil {
		t.Fatal(err)
	}
	if err := own(); err != nil {
		t.Fatal(err)
	}
	serial := webSVID.Chain[0].SerialNumber.Text(16)
	readAudit(t, file, 4) // the configuration and the three issued

	st := "--state-dir=" + m.s.stateDir
	out, code := revokeCmd(t, st, "--node", "node-z", "--since", "1h", "--reason", "keyCompromise", "--audit-log", file)
	if code != 3 || !strings.Contains(out, `meshca has no record of node "node-z"`) {
		t.Fatalf("unknown node: exit %d\n%s", code, out)
	}
	out, code = revokeCmd(t, st, "--serial", "0x7777", "--reason", "keyCompromise", "--audit-log", file)
	if code != 3 || !strings.Contains(out, "meshca has no record of issuing serial 7777 in "+file) {
		t.Fatalf("serial never issued: exit %d\n%s", code, out)
	}
	out, code = revokeCmd(t, st, "--node", "node-a", "--since", "1h", "--reason", "keyCompromise", "--audit-log", file, "--dry-run")
	t.Logf("meshca revoke --node node-a --since 1h --reason keyCompromise --audit-log audit.log --dry-run\n%s", out)
	if code != 0 || !strings.Contains(out, serial) || !strings.Contains(out, "nothing changed") {
		t.Fatalf("dry run: exit %d, want the web SVID's serial %s\n%s", code, serial, out)
	}
	if err := fetch(m.ztunnelA.Token, "web"); err != nil {
		t.Fatalf("after the dry run: %v", err)
	}
	out, code = revokeCmd(t, st, "--node", "node-a", "--since", "1h", "--reason", "keyCompromise", "--audit-log", file, "--audit-log-file", file)
	t.Logf("meshca revoke --node node-a --since 1h --reason keyCompromise --audit-log audit.log\n%s", out)
	if code != 0 || !strings.Contains(out, serial) || !strings.Contains(out, "node node-a blocked") {
		t.Fatalf("revoke --node: exit %d\n%s", code, out)
	}
	// The server follows the CA state: the block is in force within its
	// follow interval.
	err = awaitErr(t, func() error { return fetch(m.ztunnelA.Token, "web") }, func(err error) bool { return status.Code(err) == codes.PermissionDenied })
	t.Logf("node-a's ztunnel: %v", err)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "node node-a is blocked by a revocation since") ||
		!strings.Contains(msg, "meshca revoke --node node-a --undo") {
		t.Fatalf("blocked node's ztunnel: %v", err)
	}
	if err := own(); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "node node-a is blocked") {
		t.Fatalf("a workload of node-a by its own token while node-a is blocked: %v", err)
	}
	if err := fetch(m.ztunnelB.Token, "db"); err != nil {
		t.Fatalf("node-b's ztunnel while node-a is blocked: %v", err)
	}
	out, code = revokeCmd(t, st, "--node", "node-a", "--undo", "--audit-log-file", file)
	t.Logf("meshca revoke --node node-a --undo\n%s", out)
	if code != 0 {
		t.Fatalf("undo: exit %d\n%s", code, out)
	}
	if err := awaitErr(t, func() error { return fetch(m.ztunnelA.Token, "web") }, func(err error) bool { return err == nil }); err != nil {
		t.Fatalf("node-a's ztunnel after --undo: %v", err)
	}
	// A leaked key: one serial, its issuer and NotAfter from the log.
	dbSerial := lastIssued(t, file, m.id("db").String())
	out, code = revokeCmd(t, st, "--serial", dbSerial, "--reason", "keyCompromise", "--audit-log", file, "--audit-log-file", file)
	t.Logf("meshca revoke --serial %s --reason keyCompromise --audit-log audit.log\n%s", dbSerial, out)
	if code != 0 || !strings.Contains(out, "revoked 1 certificate(s)") {
		t.Fatalf("revoke --serial: exit %d\n%s", code, out)
	}
	out, code = revokeCmd(t, st, "--serial", dbSerial, "--undo", "--audit-log-file", file)
	t.Logf("meshca revoke --serial %s --undo\n%s", dbSerial, out)
	if code != 0 || !strings.Contains(out, "took back 1 revocation(s)") {
		t.Fatalf("revoke --serial --undo: exit %d\n%s", code, out)
	}
	events := readAudit(t, file, 10)
	var revocations int
	for _, e := range events {
		if e.Event == "revocation" {
			revocations++
		}
		if e.Event == "certificate" && e.Decision == "denied" && e.Reason != "node_blocked" {
			t.Errorf("denied for %q, want node_blocked: %+v", e.Reason, e)
		}
	}
	if revocations != 4 {
		t.Errorf("%d revocation events in the audit log, want 4 (node, undo, serial, undo)", revocations)
	}
}

// lastIssued is the serial of the last certificate the audit log file
// says meshca issued to identity.
func lastIssued(t *testing.T, file, identity string) string {
	t.Helper()
	serial := ""
	for _, e := range readAudit(t, file, 1) {
		if e.Event == "certificate" && e.Decision == "issued" && e.Identity == identity {
			serial = e.Serial
		}
	}
	if serial == "" {
		t.Fatalf("no certificate of %s in the audit log", identity)
	}
	return serial
}

// awaitErr calls try until done says its error is the awaited one, for
// up to 15 s, and returns that error.
func awaitErr(t *testing.T, try func() error, done func(error) bool) error {
	t.Helper()
	var err error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = try(); done(err) {
			return err
		}
	}
	t.Fatalf("still %v after 15s", err)
	return err
}

// TestRevokedCannotRenew: against the real apiserver, a workload's SVID
// revoked with meshca revoke --serial (its issuer and NotAfter from the
// audit log) no longer renews itself by certificate once the server has
// followed the state (Unauthenticated, cert_revoked), while another SVID
// of the same workload still does; --undo lets it renew again.
func TestRevokedCannotRenew(t *testing.T) {
	file := t.TempDir() + "/audit.log"
	s := startServer(t, "--audit-log-file", file)
	w := cluster.NewWorkload(t, cluster.Namespace(t, "revoke"), "ratings", "node-a")
	id := workloadID(w)
	stolen, err := s.client(t, w.Token).Fetch(context.Background(), id, caclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := s.client(t, w.Token).Fetch(context.Background(), id, caclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	renew := func(svid *caclient.SVID) error {
		_, err := s.renewalClient(t, svid).Fetch(context.Background(), id, caclient.Options{})
		return err
	}
	serial := stolen.Chain[0].SerialNumber.Text(16)
	readAudit(t, file, 3)
	st := "--state-dir=" + s.stateDir
	if out, code := revokeCmd(t, st, "--serial", "hex:"+serial, "--reason", "keyCompromise", "--audit-log", file); code != 0 {
		t.Fatalf("revoke: exit %d\n%s", code, out)
	}
	err = awaitErr(t, func() error { return renew(stolen) }, func(err error) bool { return status.Code(err) == codes.Unauthenticated })
	if msg := status.Convert(err).Message(); msg != "client certificate is revoked: authenticate with a service-account token" {
		t.Fatalf("renewal by the revoked SVID: %v", err)
	}
	if err := renew(kept); err != nil {
		t.Fatalf("renewal by another SVID of the workload: %v", err)
	}
	if out, code := revokeCmd(t, st, "--serial", "hex:"+serial, "--undo"); code != 0 {
		t.Fatalf("undo: exit %d\n%s", code, out)
	}
	if err := awaitErr(t, func() error { return renew(stolen) }, func(err error) bool { return err == nil }); err != nil {
		t.Fatalf("renewal after --undo: %v", err)
	}
}
