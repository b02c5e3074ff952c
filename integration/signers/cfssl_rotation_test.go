package signers

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCfsslRootRotation: meshca manages the trust bundle around a key
// change the cfssl server's operator makes. prepare adds the new root;
// a cfssl switched to the new key before the guard allows is caught (its
// leaves refused, not handed out to break handshakes); activate waits for
// the guard and then for cfssl to sign with the new key; retire drops the
// old root and tells the operator to destroy its key.
func TestCfsslRootRotation(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	// The roots sign leaves themselves: cfssl's signer is the root.
	root1 := testca.NewRoot(t, "cfssl root one", testca.Options{})
	root2 := testca.NewRoot(t, "cfssl root two", testca.Options{})
	writeFile(t, filepath.Join(dir, "root1.pem"), pemutil.EncodeCertificates(root1.Cert))
	writeFile(t, filepath.Join(dir, "root2.pem"), pemutil.EncodeCertificates(root2.Cert))
	// cfssl starts a leaf at the minute nearest to now, less the backdate,
	// and ends it expiry later: 31s and 70s make leaves valid at once and
	// for at least 8s, and keep the guards as short as cfssl allows.
	opts := harness.CfsslOptions{Backdate: "31s", Expiry: "70s"}
	srv := harness.StartCfssl(t, cfsslBin, root1.Authority(), opts)
	opts.Port = srv.Port
	// switchTo is the operator's key change: cfssl restarted, same address.
	switchTo := func(a *testca.CA) {
		srv.Stop()
		srv = harness.StartCfssl(t, cfsslBin, a.Authority(), opts)
	}
	st := []string{"--state-dir", state, "--signer", "cfssl"}
	if out, code := meshcaRoot(t, append([]string{"prepare", "--cert", filepath.Join(dir, "root1.pem"), "--issued-ttl", "1m"}, st...)...); code != 0 {
		t.Fatalf("first prepare: exit %d: %s", code, out)
	}
	newServing(t, dir, root1)
	m := harness.StartMeshca(t, bin, append([]string{"--kubeconfig", cluster.Kubeconfig, "--cfssl-url", srv.URL,
		"--serving-cert-file", filepath.Join(dir, "serving.pem"), "--serving-key-file", filepath.Join(dir, "serving-key.pem"),
		"--default-ttl", rotationLeafTTL.String(), "--max-ttl", "1m", "--rotation-margin", "1s"}, st...)...)
	e := &extIssuer{m: m, servingRoot: root1.Cert}
	e.mustIssue(t, root1.Cert, 1)

	if out, code := meshcaRoot(t, append([]string{"prepare", "--cert", filepath.Join(dir, "root2.pem")}, st...)...); code != 0 {
		t.Fatalf("prepare: exit %d: %s", code, out)
	}
	e.mustIssue(t, root1.Cert, 2)

	// Too early: workloads may not trust root two yet.
	switchTo(root2)
	if _, err := e.issue(t); status.Code(err) != codes.Unavailable {
		t.Fatalf("a leaf under the prepared root before its activation is safe: %v, want Unavailable", err)
	}
	switchTo(root1)
	e.mustIssue(t, root1.Cert, 2)

	// The guard passes, but cfssl still signs with the old key.
	activate := append([]string{"activate", "--margin", "1s", "--cfssl-url", srv.URL}, st...)
	deadline := time.Now().Add(90 * time.Second)
	for {
		out, code := meshcaRoot(t, activate...)
		if code == 1 && strings.Contains(out, "switch the server to the new key") {
			break
		}
		if code != 1 || !strings.Contains(out, "safe at") || time.Now().After(deadline) {
			t.Fatalf("activate before cfssl switched: exit %d: %s", code, out)
		}
		time.Sleep(300 * time.Millisecond)
	}
	switchTo(root2)
	if out, code := meshcaRoot(t, activate...); code != 0 {
		t.Fatalf("activate after cfssl switched: exit %d: %s", code, out)
	}
	e.mustIssue(t, root2.Cert, 2)

	// Leaves of root one live for up to a minute more: the guard refuses,
	// and the test forces the step rather than wait.
	retire := append([]string{"retire"}, st...)
	if out, code := meshcaRoot(t, retire...); code != 1 || !strings.Contains(out, "safe at") {
		t.Fatalf("retire while leaves of root one live: exit %d: %s", code, out)
	}
	out, code := meshcaRoot(t, append(retire, "--force", "--reason", "end of test")...)
	if code != 0 {
		t.Fatalf("forced retire: exit %d: %s", code, out)
	}
	if !strings.Contains(out, "to do by the cfssl operator: destroy the key") {
		t.Errorf("retire does not tell the operator to destroy the old key: %s", out)
	}
	e.mustIssue(t, root2.Cert, 1)
	if got := stateRoots(t, state)[keymgr.PhaseRetired]; len(got) != 1 || !got[0].Root.Equal(root1.Cert) {
		t.Fatalf("retired authorities %d, want root one", len(got))
	}
}
