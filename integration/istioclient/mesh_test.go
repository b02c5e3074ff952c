package istioclient

import (
	"crypto/x509"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
)

// TestIstioMeshThroughRootRotations runs a mesh of the real istiod and
// istio-agent, with meshca as its CA and as the keeper of istiod's
// certificate (--istiod-cert-secret, --istiod-deployment), through two
// root rotations: one taken with `meshca root`, one by meshca's automatic
// rotation. Stand-ins play the kubelet (Secret and ConfigMaps into files),
// istiod's Service and the Deployment controller (a rollout when meshca
// patches the pod template: istiod reads the roots it verifies proxies
// with only when it starts).
//
// Throughout, the agent renews, and each certificate it writes verifies
// against the bundle its namespace is published at that moment; in every
// phase a new xDS client presenting the agent's current certificate is
// served by istiod, and every held stream gets a push; a stream ends only
// when istiod's Pod is replaced, and then reconnects; no TLS handshake
// fails for a certificate, on either side. Between the phases' checks,
// probers open a fresh TLS connection to istiod's xDS and webhook ports
// every 250 ms, verified as a proxy and the apiserver would verify them
// at that moment (mesh_probe_test.go); the apiserver injects a Pod and
// refuses an invalid Gateway through istiod's webhooks in every phase and
// every 2 s (mesh_webhook_test.go). activate and retire are retried until
// their guards let them pass, never forced.
func TestIstioMeshThroughRootRotations(t *testing.T) {
	began := time.Now()
	discoveryBin, agentBin := istioBinaries(t)
	m := newMesh(t, discoveryBin, agentBin)
	_, pods, _ := m.dep.snapshot()
	t.Logf("mesh up after %v (istiod ready after %v), agent certified", time.Since(began).Round(time.Millisecond), pods[0].started)
	m.xds.openViaAgent("start")

	var prepared time.Time
	phases := []struct {
		name string
		act  func()
		// settled says "" once meshca, the Deployment and the agent have
		// reached what the phase leads to.
		settled func() string
	}{
		{"start", nil, nil},
		{"prepare", func() { prepared = time.Now(); m.prepare() }, m.rolledOutWithNewRoot},
		{"activate", func() { m.stepUntil("activate") }, m.signingUnderNewest},
		{"retire", func() { m.stepUntil("retire") }, m.publishingNewestAlone},
		{"auto-prepare", func() { m.restartWithAutoRotation(prepared) }, m.rolledOutWithNewRoot},
		{"auto-activate", nil, m.signingUnderNewest},
		{"auto-retire", nil, m.publishingNewestAlone},
	}
	for _, p := range phases {
		phaseBegan := time.Now()
		m.hooks.enter(p.name)
		if p.act != nil {
			p.act()
		}
		if p.settled != nil {
			m.waitFor(p.name, 2*time.Minute, p.settled)
		}
		m.check(p.name)
		t.Logf("%s: settled and checked in %v; %d roots published, %d istiod restarts, %d Secret rewrites, %d streams held",
			p.name, time.Since(phaseBegan).Round(time.Millisecond), len(m.published(m.appNS)), m.dep.restarts(),
			len(m.rewritten()), len(m.xds.held()))
	}
	m.meshca.Stop() // no further rotation while the figures are taken
	m.report(began)
}

// prepare adds a root with `meshca root prepare`, one hour long: the
// automatic rotation that follows makes its successor as long.
func (m *mesh) prepare() {
	m.t.Helper()
	if out, code := m.rootStep("prepare", "--state-dir", m.stateDir, "--lifetime", "1h", "--reason", "mesh test"); code != 0 {
		m.t.Fatalf("meshca root prepare: exit %d\n%s", code, out)
	}
}

// stepUntil runs `meshca root verb` with istiod's Secret, as an operator
// would, every second until it passes; each refusal of a guard (exit 1)
// is recorded.
func (m *mesh) stepUntil(verb string) {
	m.t.Helper()
	args := []string{verb, "--state-dir", m.stateDir, "--istiod-cert-secret", m.istiodNS + "/" + istiodSecret,
		"--kubeconfig", cluster.Kubeconfig, "--margin=1s", "--reason", "mesh test"}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		out, code := m.rootStep(args...)
		switch {
		case code == 0:
			return
		case code != 1 || time.Now().After(deadline):
			m.t.Fatalf("meshca root %s: exit %d after %d refusals\n%s", verb, code, len(m.refusals[verb]), out)
		}
		why := refusal(out)
		if !slices.Contains(m.refusals[verb], why) {
			m.t.Logf("meshca root %s refused: %s", verb, why)
		}
		m.refusals[verb] = append(m.refusals[verb], why)
	}
}

// refusal is why a step was refused: the CLI's last line (the one before
// is its audit event), without the time it names, which changes at each
// try.
func refusal(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	why := strings.TrimPrefix(lines[len(lines)-1], "meshca: ")
	why, _, _ = strings.Cut(why, "; safe at")
	return why
}

// restartWithAutoRotation restarts meshca with automatic rotation, due at
// once for the root `meshca root` prepared: it prepares the root that
// follows, activates and retires as soon as the guards allow. Its
// successor, as long-lived, becomes due as long after its birth as this
// one was at the restart: the wait makes that longer than the phases that
// follow, so that no third rotation starts before the test ends.
func (m *mesh) restartWithAutoRotation(prepared time.Time) {
	m.t.Helper()
	const dueAfter = 90 * time.Second
	if wait := time.Until(prepared.Add(dueAfter)); wait > 0 {
		m.t.Logf("holding the mesh %v before the automatic rotation, as istiod's certificate renews", wait.Round(time.Second))
		time.Sleep(wait)
	}
	// adsc keeps the bundle it was opened with: the clients whose bundle
	// lacks istiod's issuer now would fail to dial the next istiod Pod.
	if dropped := m.xds.dropStale(m.secret().Chain); len(dropped) > 0 {
		m.t.Logf("closed %d held xDS clients whose bundle no longer holds istiod's root: %s", len(dropped), strings.Join(dropped, ", "))
	}
	root := m.roots[len(m.roots)-1]
	due := time.Now().Add(-time.Second)
	prepareAt := float64(root.NotAfter.Sub(due)) / float64(root.NotAfter.Sub(root.NotBefore))
	m.meshca.Stop()
	m.meshcaRestartedAt = time.Now()
	m.startMeshca("--auto-rotate", "--auto-rotate-interval=1s", "--auto-rotate-prepare-at", strconv.FormatFloat(prepareAt, 'f', 6, 64),
		"--rotation-margin=1s")
	m.t.Logf("meshca restarted in %v with automatic rotation (prepare at %.6f of the root's life left)",
		time.Since(m.meshcaRestartedAt).Round(time.Millisecond), prepareAt)
}

// rolledOutWithNewRoot: a new root is published to both namespaces and
// in istiod's Secret, meshca listed it in the Deployment's pod template,
// and istiod's Pod was replaced to load it: once per root after the
// first.
func (m *mesh) rolledOutWithNewRoot() string {
	published := m.published(m.appNS)
	if len(published) != 2 {
		return fmt.Sprintf("istio-ca-root-cert in %s holds %d roots, want 2", m.appNS, len(published))
	}
	for _, r := range published {
		if !containsCert(m.roots, r) {
			m.roots = append(m.roots, r)
		}
	}
	annotated := m.annotatedRoots()
	for _, r := range published {
		if !slices.Contains(annotated, keymgr.Fingerprint(r)) {
			return "meshca has not listed the new root in the Deployment's pod template"
		}
	}
	switch {
	case len(m.published(m.istiodNS)) != 2:
		return "istio-ca-root-cert in istiod's namespace does not hold both roots"
	case len(m.secret().Roots) != 2:
		return "the Secret's ca.crt does not hold both roots"
	case m.dep.restarts() < len(m.roots)-1:
		return fmt.Sprintf("%d istiod restarts, want %d", m.dep.restarts(), len(m.roots)-1)
	}
	return m.rolledOut()
}

// rolledOut says "" once the Deployment's status shows its current
// generation running.
func (m *mesh) rolledOut() string {
	d, err := cluster.Client.AppsV1().Deployments(m.istiodNS).Get(m.ctx, istiodDeployment, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	if s := d.Status; s.ObservedGeneration < d.Generation || s.UpdatedReplicas != 1 || s.Replicas != 1 || s.AvailableReplicas != 1 {
		return fmt.Sprintf("Deployment generation %d, status %+v", d.Generation, s)
	}
	return ""
}

// signingUnderNewest: the newest root signs istiod's certificate and the
// agent's.
func (m *mesh) signingUnderNewest() string {
	root := m.roots[len(m.roots)-1]
	if !verifiesTo(m.secret().Chain, root) {
		return "istiod's certificate is not issued under the new root yet"
	}
	if c, ok := m.certs.latest(); !ok || !c.root.Equal(root) {
		return "the agent holds no certificate under the new root yet"
	}
	return ""
}

// publishingNewestAlone: the old root left istio-ca-root-cert in both
// namespaces and istiod's ca.crt.
func (m *mesh) publishingNewestAlone() string {
	root := m.roots[len(m.roots)-1]
	for _, roots := range [][]*x509.Certificate{m.published(m.appNS), m.published(m.istiodNS), m.secret().Roots} {
		if len(roots) != 1 || !roots[0].Equal(root) {
			return fmt.Sprintf("a bundle holds %d roots, want the new one alone", len(roots))
		}
	}
	return ""
}

// check is what every phase must leave: istiod serves the Secret's
// certificate, injects a new Pod and refuses an invalid Gateway through
// the apiserver, with caBundle the roots it mounts; every held stream is
// served (reconnected after a rollout) and gets a push, and a new client
// presenting the agent's current certificate is served.
func (m *mesh) check(phase string) {
	m.t.Helper()
	m.waitFor(phase+": istiod serves the Secret's certificate", 15*time.Second, m.servesSecret)
	m.hooks.admit(m.ctx)
	m.waitFor(phase+": istiod's webhooks' caBundle is the bundle istiod mounts", 15*time.Second,
		func() string { return m.hooks.patched(m.ctx, m.published(m.istiodNS)) })
	m.xds.reconnected(phase, 30*time.Second)
	m.xds.push(m.ctx, phase)
	m.xds.open(phase)
}

// servesSecret says "" when istiod, through its Service, serves the
// certificate of its Secret, verified for its name with the bundle
// published to the workload.
func (m *mesh) servesSecret() string {
	want := m.secret().leaf()
	chain, err := harness.ServingChain(m.svc.addr(), m.istiodSAN(), certs.Pool(m.published(m.appNS)...))
	switch {
	case err != nil:
		return err.Error()
	case want == nil:
		return "no certificate in the Secret"
	case chain[0].SerialNumber.Cmp(want.SerialNumber) != 0:
		return fmt.Sprintf("istiod serves %s, the Secret holds %s", serial(chain[0].SerialNumber), serial(want.SerialNumber))
	}
	return ""
}

func verifiesTo(chain []*x509.Certificate, root *x509.Certificate) bool {
	if len(chain) == 0 {
		return false
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: certs.Pool(root), Intermediates: certs.Pool(chain[1:]...),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err == nil
}

func containsCert(list []*x509.Certificate, c *x509.Certificate) bool {
	for _, l := range list {
		if l.Equal(c) {
			return true
		}
	}
	return false
}

func serial(n *big.Int) string { return fmt.Sprintf("%.12x", n) }

// rewritten are the new istiod certificates the kubelet wrote into
// running Pods.
func (m *mesh) rewritten() []time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]time.Time(nil), m.rewrites...)
}
