package e2e

import (
	"context"
	"crypto/x509"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/keymgr/certs"
)

// rootStep runs `meshca root args...` and returns its output and exit code.
func rootStep(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"root"}, args...)...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// TestRootRotationLive: a running meshca follows `meshca root` on its
// state directory without a restart. prepare puts the new root in every
// reply's bundle; activate is refused until the clients have renewed
// with that bundle, then the new authority signs; retire is refused while
// leaves of the old one live, then its root leaves the bundle. Every
// certificate issued along the way verifies against the bundle of the
// reply before it, as a client that trusts only its last reply needs.
func TestRootRotationLive(t *testing.T) {
	s := startServer(t)
	w := cluster.NewWorkload(t, cluster.Namespace(t, "rotation"), "web", "node-a")
	id := workloadID(w)
	c := s.client(t, w.Token)
	const ttl = 6 * time.Second
	var last *caclient.SVID
	fetch := func() *caclient.SVID {
		t.Helper()
		svid, err := c.Fetch(context.Background(), id, caclient.Options{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if last != nil {
			if _, err := svid.Chain[0].Verify(x509.VerifyOptions{Roots: certs.Pool(last.Roots...),
				Intermediates: certs.Pool(svid.Chain[1:]...), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				t.Fatalf("a new leaf does not verify against the bundle of the reply before it: %v", err)
			}
		}
		last = svid
		return svid
	}
	waitRoots := func(n int) *caclient.SVID {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(250 * time.Millisecond) {
			if svid := fetch(); len(svid.Roots) == n {
				return svid
			}
			if time.Now().After(deadline) {
				t.Fatalf("the bundle did not reach %d roots within 10s", n)
			}
		}
	}
	st := "--state-dir=" + s.stateDir
	first := fetch()
	if len(first.Roots) != 1 {
		t.Fatalf("%d roots before rotation", len(first.Roots))
	}
	oldRoot := first.Roots[0]

	if out, code := rootStep(t, "prepare", st, "--reason", "e2e rotation"); code != 0 {
		t.Fatalf("prepare: exit %d\n%s", code, out)
	}
	waitRoots(2)
	if out, code := rootStep(t, "activate", st, "--margin=0s"); code != 1 || !strings.Contains(out, "safe at") {
		t.Fatalf("activate at once: exit %d, want a refusal saying when\n%s", code, out)
	}
	var out string
	// Half the longest leaf lifetime: the 2-minute backdate counts, as
	// istio-agent and ztunnel count it when they decide to renew.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(2 * time.Second) {
		fetch() // clients keep renewing
		code := 0
		if out, code = rootStep(t, "activate", st, "--margin=0s"); code == 0 {
			break
		}
		if code != 1 || time.Now().After(deadline) {
			t.Fatalf("activate: exit %d\n%s", code, out)
		}
	}
	var signedByNew *caclient.SVID
	for deadline := time.Now().Add(10 * time.Second); signedByNew == nil; time.Sleep(250 * time.Millisecond) {
		if svid := fetch(); svid.Chain[0].CheckSignatureFrom(oldRoot) != nil {
			signedByNew = svid
		}
		if time.Now().After(deadline) {
			t.Fatal("the new authority did not sign within 10s of activate")
		}
	}
	if out, code := rootStep(t, "retire", st, "--margin=1s"); code != 1 || !strings.Contains(out, "safe at") {
		t.Fatalf("retire while old leaves live: exit %d, want a refusal\n%s", code, out)
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(2 * time.Second) {
		fetch()
		code := 0
		if out, code = rootStep(t, "retire", st, "--margin=1s"); code == 0 {
			break
		}
		if code != 1 || time.Now().After(deadline) {
			t.Fatalf("retire: exit %d\n%s", code, out)
		}
	}
	final := waitRoots(1)
	if final.Roots[0].Equal(oldRoot) {
		t.Fatal("the retired root is still the bundle")
	}
	if !strings.Contains(s.Logs(), `"msg":"CA state in service"`) {
		t.Error("the server did not log the state it put in service")
	}
}
