package e2e

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// istiodMesh is a meshca that keeps istiod's certificate in a Secret of
// its own namespace and publishes istio-ca-root-cert there, with leaves
// short enough for a rotation's guards to pass within seconds.
type istiodMesh struct {
	t        *testing.T
	ns       string
	stateDir string
	m        *harness.Meshca
}

const istiodTTL = 10 * time.Second

func (s *istiodMesh) start() {
	s.m = harness.StartMeshca(s.t, bin, "--state-dir", s.stateDir, "--kubeconfig", cluster.Kubeconfig, "--auto-rotate=false",
		"--istiod-cert-secret", s.ns+"/istiod-tls", "--istiod-cert-ttl", istiodTTL.String(), "--backdate=1s",
		"--publish-root-cert-configmaps", "--trust-namespace-selector", "meshca-istiod-test="+s.ns, "--trust-lease-namespace", s.ns)
}

// held is the Secret now, and the roots istio-ca-root-cert holds.
func (s *istiodMesh) held() (*istiodcert.Held, []*x509.Certificate) {
	ctx := context.Background()
	sec, err := cluster.Client.CoreV1().Secrets(s.ns).Get(ctx, "istiod-tls", metav1.GetOptions{})
	if err != nil {
		return &istiodcert.Held{}, nil
	}
	cm, err := cluster.Client.CoreV1().ConfigMaps(s.ns).Get(ctx, trust.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return istiodcert.Parse(sec), nil
	}
	roots, _ := pemutil.ParseCertificates([]byte(cm.Data[trust.DataKey]))
	return istiodcert.Parse(sec), roots
}

// invariant is the rule every step must keep: istiod's certificate
// verifies, for its name, against the bundle the proxies are given
// (istio-ca-root-cert), and its ca.crt holds every root of that bundle,
// any of which a proxy's certificate may chain to. "" when it holds.
func invariant(h *istiodcert.Held, published []*x509.Certificate, ns string) string {
	switch {
	case h.Leaf() == nil || len(published) == 0:
		return "no certificate or no published bundle yet"
	case !h.KeyMatches:
		return "tls.key is not the leaf's key"
	}
	if _, err := h.Leaf().Verify(x509.VerifyOptions{DNSName: "istiod." + ns + ".svc", Roots: certs.Pool(published...),
		Intermediates: certs.Pool(h.Chain[1:]...), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Sprintf("istiod's certificate does not verify against istio-ca-root-cert: %v", err)
	}
	for _, r := range published {
		found := false
		for _, c := range h.Roots {
			found = found || c.Equal(r)
		}
		if !found {
			return fmt.Sprintf("ca.crt lacks the published root %q", r.Subject)
		}
	}
	return ""
}

// waitFor waits until ok says "" of the Secret and the published bundle,
// and returns them.
func (s *istiodMesh) waitFor(what string, ok func(*istiodcert.Held, []*x509.Certificate) string) (*istiodcert.Held, []*x509.Certificate) {
	s.t.Helper()
	var why string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		h, roots := s.held()
		if why = ok(h, roots); why == "" {
			if inv := invariant(h, roots, s.ns); inv != "" {
				s.t.Fatalf("%s: %s", what, inv)
			}
			return h, roots
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: not within 20s: %s", what, why)
		}
	}
}

// step runs `meshca root verb` with the state and istiod's Secret until it
// exits 0 (or, with want 1, until a guard refuses it saying wantOut),
// while a time guard still refuses it, up to a minute.
func (s *istiodMesh) step(verb string, want int, wantOut string) string {
	s.t.Helper()
	args := []string{verb, "--state-dir", s.stateDir}
	if verb != "prepare" {
		args = append(args, "--istiod-cert-secret", s.ns+"/istiod-tls", "--kubeconfig", cluster.Kubeconfig, "--margin=1s")
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		out, code := rootStep(s.t, args...)
		switch {
		case code == want && strings.Contains(out, wantOut):
			return out
		case code != 1 || time.Now().After(deadline):
			s.t.Fatalf("meshca root %s: exit %d, want %d with %q\n%s", verb, code, want, wantOut, out)
		}
	}
}

// TestIstiodCertificateThroughCLIRotation: the Secret meshca keeps for
// istiod verifies against istio-ca-root-cert, and its ca.crt holds every
// root of it, at every step of a rotation taken with `meshca root`. Its
// guards hold each step until istiod's certificate is ready for it:
// activate while its ca.crt lacks the new root, retire while it chains
// only to the retiring root; both say when they become safe, and pass
// once the keeper has caught up.
func TestIstiodCertificateThroughCLIRotation(t *testing.T) {
	s := &istiodMesh{t: t, stateDir: t.TempDir()}
	s.ns = cluster.Namespace(t, "istiod-cert")
	ns, err := cluster.Client.CoreV1().Namespaces().Get(context.Background(), s.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels = map[string]string{"meshca-istiod-test": s.ns}
	if _, err := cluster.Client.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.start()
	first, roots := s.waitFor("first write", func(h *istiodcert.Held, r []*x509.Certificate) string {
		if h.Leaf() == nil || len(r) != 1 {
			return "no certificate, or not one published root"
		}
		return ""
	})
	rootA := roots[0]
	renewals := 0

	// prepare, with the keeper down: the CLI's activate waits for istiod.
	s.m.Stop()
	s.step("prepare", 0, "prepared")
	out := s.step("activate", 1, "istiod's certificate (Secret "+s.ns+"/istiod-tls) does not trust root")
	t.Logf("activate before istiod trusts the new root: %s", firstLine(out))
	if !strings.Contains(out, "safe once") && !strings.Contains(out, "safe at") {
		t.Errorf("the refusal does not say when activate becomes safe:\n%s", out)
	}
	s.start()
	prepared, roots := s.waitFor("the keeper after prepare", func(h *istiodcert.Held, r []*x509.Certificate) string {
		if len(h.Roots) != 2 || len(r) != 2 {
			return fmt.Sprintf("ca.crt has %d roots, istio-ca-root-cert %d", len(h.Roots), len(r))
		}
		return ""
	})
	if prepared.Leaf().Equal(first.Leaf()) || prepared.Leaf().CheckSignatureFrom(rootA) != nil {
		t.Fatal("after prepare the leaf was not reissued (istiod reloads its roots only with a new tls.crt), or not by the active authority")
	}
	renewals++
	rootB := roots[0]
	if rootB.Equal(rootA) {
		rootB = roots[1]
	}

	// activate, with the keeper down again: retire waits for istiod.
	s.m.Stop()
	s.step("activate", 0, "active")
	if h, r := s.held(); invariant(h, r, s.ns) != "" {
		t.Fatalf("after activate, before the keeper: %s", invariant(h, r, s.ns))
	}
	out = s.step("retire", 1, "istiod's certificate (Secret "+s.ns+"/istiod-tls)")
	t.Logf("retire while istiod's certificate is under the old root: %s", firstLine(out))
	if !strings.Contains(out, "safe once its keeper has rewritten it") {
		t.Errorf("the refusal does not say when retire becomes safe:\n%s", out)
	}
	status, code := rootStep(t, "status", "--state-dir", s.stateDir, "--istiod-cert-secret", s.ns+"/istiod-tls", "--kubeconfig", cluster.Kubeconfig)
	if code != 0 || !strings.Contains(status, "istiod's certificate ("+s.ns+"/istiod-tls)") || !strings.Contains(status, "next step: retire") {
		t.Errorf("meshca root status: exit %d\n%s", code, status)
	}
	s.start()
	s.waitFor("the keeper after activate", func(h *istiodcert.Held, _ []*x509.Certificate) string {
		if h.Leaf().CheckSignatureFrom(rootB) != nil {
			return "the leaf is not issued under the new authority"
		}
		return ""
	})
	renewals++
	s.step("retire", 0, "retired")
	final, _ := s.waitFor("the keeper after retire", func(h *istiodcert.Held, r []*x509.Certificate) string {
		if len(h.Roots) != 1 || len(r) != 1 || !r[0].Equal(rootB) {
			return fmt.Sprintf("ca.crt has %d roots, istio-ca-root-cert %d", len(h.Roots), len(r))
		}
		return ""
	})
	renewals++
	if !final.Roots[0].Equal(rootB) {
		t.Fatal("ca.crt does not hold the new root alone")
	}
	harness.Report(t, "istiod certificate through a CLI rotation: %d rewrites checked (prepare, activate, retire), invariant held at every step, "+
		"activate and retire refused while istiod was behind", renewals)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
