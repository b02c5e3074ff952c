package istioclient

// The figures of TestIstioMeshThroughRootRotations: what must be zero,
// what must have happened, and controls showing that the failure
// detectors would have seen a failure.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"istio.io/istio/pkg/adsc"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr/certs"
)

// report checks the figures of the run and reports them.
func (m *mesh) report(began time.Time) {
	t := m.t
	issued, certFailures := m.certs.results()
	rollouts, pods, depErrs := m.dep.snapshot()
	tlsConns, ends, reconnects := m.xds.counts()
	handshakes := clientHandshakes.since(m.handshakeMark)
	var istiodErrs, beforePatch []string
	for _, p := range pods {
		for _, line := range certErrors(p.logs()) {
			if m.beforeWebhooksPatched(line) {
				beforePatch = append(beforePatch, line)
				continue
			}
			istiodErrs = append(istiodErrs, p.name+": "+line)
		}
	}
	afterRestart, margin, lapses := m.renewals(issued)
	renewedAt := time.Now()
	if afterRestart.leaf != nil {
		renewedAt = afterRestart.at
	}
	atRestart, agentErrs := m.agentCertErrors(renewedAt)
	if len(atRestart) > 1 {
		agentErrs = append(agentErrs, fmt.Sprintf("%d CA requests failed after meshca's restart, want at most the first: %s",
			len(atRestart), strings.Join(atRestart, "\n")))
	}
	m.reportProbes(rollouts)
	m.reportWebhooks()
	m.controls() // after the figures: the controls fail on purpose

	for _, f := range []struct {
		what string
		bad  []string
	}{
		{"agent certificates that did not verify against istio-ca-root-cert when written", certFailures},
		{"agent renewals late or after an expiry", lapses},
		{"held streams that ended outside an istiod rollout", m.xds.unattributed(rollouts)},
		{"TLS handshakes this process's xDS clients failed", handshakes},
		{"certificate or TLS errors in istiod's logs", istiodErrs},
		{"certificate or TLS errors in the agent's log, besides its CA client's first request after meshca's restart", agentErrs},
		{"errors of the Deployment controller stand-in", depErrs},
		{"errors of the kubelet stand-in", m.kube.errors()},
	} {
		if len(f.bad) > 0 {
			t.Errorf("%d %s:\n%s", len(f.bad), f.what, strings.Join(f.bad, "\n"))
		}
	}
	renewals := len(issued) - 1
	if want := int(time.Since(m.agentStarted) / agentSecretTTL); renewals < want {
		t.Errorf("the agent renewed %d times in %v, want at least %d (SECRET_TTL %v)", renewals,
			time.Since(m.agentStarted).Round(time.Second), want, agentSecretTTL)
	}
	if reconnects != ends {
		t.Errorf("%d held streams ended, %d reconnected", ends, reconnects)
	}
	if p := m.published(m.appNS); len(p) != 1 || !p[0].Equal(m.roots[len(m.roots)-1]) {
		t.Errorf("a third rotation began before the test ended: %d roots published", len(p))
	}
	if m.dep.restarts() < 2 {
		t.Errorf("istiod restarted %d times, want one per rotation", m.dep.restarts())
	}
	var took []string
	for _, r := range rollouts {
		if r.replaced {
			took = append(took, fmt.Sprintf("rollout of generation %d in %v", r.generation, r.ended.Sub(r.began).Round(100*time.Millisecond)))
		}
	}
	harness.Report(t, "2 root rotations (meshca root, then automatic) with the real istiod and istio-agent in %v: "+
		"agent certificates renewed %d, each verified against istio-ca-root-cert when written (%d failed), "+
		"each before the last expired (tightest %v before); "+
		"xDS clients opened %d (%s; one through the agent), held at the end %d (%d closed as their bundle lost istiod's root), "+
		"TLS connections to istiod %d, stream ends %d, all at istiod restarts, reconnects %d; "+
		"istiod restarts %d (%s), istiod's Secret rewritten %d times under running Pods; "+
		"refusals before passing: activate %d, retire %d, never forced; TLS failures: xDS clients %d, istiod %d (detectors checked), "+
		"istiod's webhook server refused by the apiserver before istiod first patched caBundle %d; "+
		"agent CA requests refused by the agent's stale CA_ROOT_CA after meshca's restart %d (at most its first), "+
		"its next certificate %v after the restart",
		time.Since(began).Round(time.Second), renewals, len(certFailures), margin.Round(100*time.Millisecond),
		len(m.xds.clients), m.xds.perPhase(), len(m.xds.held()), m.xds.dropped,
		tlsConns, ends, reconnects, m.dep.restarts(), strings.Join(took, ", "), len(m.rewritten()),
		len(m.refusals["activate"]), len(m.refusals["retire"]), len(handshakes), len(istiodErrs), len(beforePatch), len(atRestart),
		renewedAt.Sub(m.meshcaRestartedAt).Round(100*time.Millisecond))
}

// reportProbes runs the probers' controls while they still probe, stops
// them, and judges and reports their figures.
func (m *mesh) reportProbes(rollouts []rollout) {
	harness.Report(m.t, "istiod's xDS port probed through 2 rotations with a fresh TLS connection every %v, verifying istiod's certificate "+
		"as istio-agent does (root-cert.pem as mounted at that moment, ISTIOD_SAN %s): %s",
		probeEvery, m.istiodSAN(), m.probeFigures(m.probe, rollouts))
	m.hookFigures = m.probeFigures(m.hookProbe, rollouts)
}

// probeFigures runs p's control on its first target, stops p, judges its
// probes, and returns their figures.
func (m *mesh) probeFigures(p *istiodProber, rollouts []rollout) string {
	t := m.t
	foreign := testca.NewRoot(t, "foreign root", testca.Options{})
	control, controlBad := probeControl(p.targets[0], foreign.Cert, m.roots[0], 3)
	p.stop()
	bad := append(p.judge(rollouts, m.rewritten()), controlBad...)
	if len(bad) > 0 {
		t.Errorf("probes of istiod (%s), a fresh TLS connection every %v:\n%s", p.targets[0].addr, probeEvery, strings.Join(bad, "\n"))
	}
	tally := &p.tally
	return fmt.Sprintf("%d probes over %v (longest gap %v), "+
		"%d ok, %d failed verification, %d failed otherwise, %d unreachable (allowed only while istiod's Pod is replaced: windows of %s); "+
		"through %d Secret rewrites and %d istiod restarts; control, 3 probes each: %s",
		len(tally.all()), p.stopped.Sub(p.started).Round(time.Second),
		p.longestGap().Round(time.Millisecond), tally.count(probeOK), tally.count(probeUnverified), tally.count(probeFailed),
		tally.count(probeUnreachable), restartWindows(rollouts), len(m.rewritten()), m.dep.restarts(), control)
}

// reportWebhooks judges and reports what went through istiod's webhooks.
func (m *mesh) reportWebhooks() {
	injections, validations, bundles, phases := m.hooks.results()
	bad := append(judgeAdmissions("injection", injections, phases), judgeAdmissions("validation", validations, phases)...)
	writers := m.hooks.writers(m.ctx)
	if len(writers) != 1 || !strings.HasPrefix(writers[0], "pilot-discovery") {
		bad = append(bad, fmt.Sprintf("the webhook configurations were written by %q, want istiod (pilot-discovery) alone", writers))
	}
	if len(bad) > 0 {
		m.t.Errorf("istiod's webhooks, called by the apiserver:\n%s", strings.Join(bad, "\n"))
	}
	per := map[string]int{}
	for _, a := range injections {
		per[a.phase]++
	}
	var counts []string
	for _, p := range phases {
		counts = append(counts, fmt.Sprintf("%s %d", p, per[p]))
	}
	harness.Report(m.t, "istiod's webhooks (ENABLE_CA_SERVER=false, serving meshca's istiod-tls) called by the real apiserver through 2 rotations: "+
		"Pods created in an istio-injection=enabled namespace %d, injected with istio-proxy %d (%d failed); "+
		"invalid Gateways refused by istiod's validation %d of %d (%d failed); each in every phase (%s); "+
		"caBundle kept by istiod from the roots it mounts (roots in it over time: %s), written by %s alone, never by meshca; "+
		"istiod's webhook port probed with a fresh TLS connection every %v, verified as the apiserver does (each configuration's caBundle "+
		"at that moment, the Service's name): %s",
		len(injections), len(injections)-failed(injections), failed(injections), len(validations)-failed(validations), len(validations),
		failed(validations), strings.Join(counts, ", "), strings.Join(bundles, " → "), strings.Join(writers, ", "), probeEvery, m.hookFigures)
}

// judge lists the admissions that failed, and the phases with none.
func judgeAdmissions(what string, list []admitted, phases []string) (bad []string) {
	per := map[string]int{}
	for _, a := range list {
		per[a.phase]++
		if a.err != nil {
			bad = append(bad, fmt.Sprintf("%s in %s at %s: %v", what, a.phase, a.at.Format("15:04:05.000"), a.err))
		}
	}
	for _, p := range phases {
		if per[p] == 0 {
			bad = append(bad, fmt.Sprintf("no %s in phase %s", what, p))
		}
	}
	return bad
}

func failed(list []admitted) int {
	n := 0
	for _, a := range list {
		if a.err != nil {
			n++
		}
	}
	return n
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// beforeWebhooksPatched says whether an istiod log line is its webhook
// server's failed handshake from before istiod first patched the
// webhooks' caBundle: Istio's chart creates them without one, and
// istiod's validation controller makes its first dry run (through the
// apiserver, to learn whether it may fail closed) in the same turn in
// which it patches caBundle, so the apiserver may call it once with no
// roots to verify it by. An install's first seconds, before any
// workload; the same failure after it fails the test.
func (m *mesh) beforeWebhooksPatched(line string) bool {
	stamp, _, _ := strings.Cut(line, "\t")
	at, err := time.Parse(time.RFC3339Nano, stamp)
	return err == nil && at.Before(m.hooksPatchedAt) && strings.Contains(line, "http: TLS handshake error")
}

// agentCertErrors splits the certificate and TLS errors of the agent's
// log: its CA client's between meshca's restart and the agent's first
// certificate after it, one per failed request (Istio's citadel client
// dials again with the CA_ROOT_CA it read when it last connected, and
// reads it anew only after a request failed, while meshca now serves a
// certificate under the root activated since), and all the others.
func (m *mesh) agentCertErrors(renewed time.Time) (atRestart, others []string) {
	for _, line := range certErrors(m.agent.logs()) {
		stamp, _, _ := strings.Cut(line, "\t")
		at, err := time.Parse(time.RFC3339Nano, stamp)
		afterRestart := err == nil && !m.meshcaRestartedAt.IsZero() && !at.Before(m.meshcaRestartedAt) && at.Before(renewed)
		// The request's failure is logged three times: by the CA client,
		// the secret cache and the agent's retry loop.
		caClient := strings.Contains(line, "failed to sign") || strings.Contains(line, "failed to get certificate")
		switch {
		case afterRestart && caClient:
			if strings.Contains(line, "failed to sign CSR") {
				atRestart = append(atRestart, line)
			}
		default:
			others = append(others, line)
		}
	}
	return atRestart, others
}

// renewals judges the agent's certificates: each written before the one
// it replaced expired, none later than agentRenewalBound after it (the
// agent renews at half of SECRET_TTL, and retries a failed request within
// seconds). It returns the first certificate written after meshca's
// restart, the tightest margin before an expiry, and what went wrong.
func (m *mesh) renewals(issued []issued) (afterRestart issued, margin time.Duration, bad []string) {
	margin = agentSecretTTL
	for i := 1; i < len(issued); i++ {
		prev, c := issued[i-1], issued[i]
		margin = min(margin, prev.leaf.NotAfter.Sub(c.at))
		if !c.at.Before(prev.leaf.NotAfter) {
			bad = append(bad, fmt.Sprintf("the agent's certificate expired at %s, its successor was written at %s",
				prev.leaf.NotAfter.Format(time.TimeOnly), c.at.Format("15:04:05.000")))
		}
		if gap := c.at.Sub(prev.at); gap > agentRenewalBound {
			bad = append(bad, fmt.Sprintf("the agent renewed %v after its previous certificate, want at most %v", gap.Round(time.Millisecond), agentRenewalBound))
		}
		if afterRestart.leaf == nil && !m.meshcaRestartedAt.IsZero() && c.at.After(m.meshcaRestartedAt) {
			afterRestart = c
		}
	}
	return afterRestart, margin, bad
}

// agentRenewalBound is the longest the agent may take between two
// certificates: half of SECRET_TTL, and 5 s for a failed request (five
// attempts over 1.5 s) and the retry after it.
const agentRenewalBound = agentSecretTTL/2 + 5*time.Second

// controls fail two handshakes on purpose and check that the detectors
// see them: istiod refuses a client certificate of a foreign CA and logs
// it; an xDS client here verifying istiod with a foreign root fails, and
// gRPC's log says so. Without them, zero failures would prove nothing.
func (m *mesh) controls() {
	t := m.t
	foreign := testca.NewRoot(t, "foreign root", testca.Options{})
	_, pods, _ := m.dep.snapshot()
	pod := pods[len(pods)-1]
	mark := pod.mark()
	if err := tlsProbe(m.svc.addr(), m.istiodSAN(), certs.Pool(m.published(m.appNS)...), clientCert(t, foreign, m.certs.id)); err == nil {
		t.Error("control: istiod accepted a client certificate of a foreign CA")
	}
	if !eventually(5*time.Second, func() bool { return len(certErrors(pod.since(mark))) > 0 }) {
		t.Errorf("control: istiod refused a foreign client certificate, but its log has no line the check of its logs matches:\n%s", pod.since(mark))
	}

	hmark := clientHandshakes.mark()
	rootFile := filepath.Join(t.TempDir(), "foreign.pem")
	writeFile(t, rootFile, pemutil.EncodeCertificates(foreign.Cert))
	x := &xdsClient{name: "control"}
	cfg := adsc.Config{CertDir: m.agent.out, XDSRootCAFile: rootFile, XDSSAN: m.istiodSAN(), Namespace: m.appNS, Workload: "control"}
	if err := x.dial(m.svc.addr(), cfg); err == nil {
		x.close()
		t.Error("control: an xDS client verifying istiod with a foreign root was served")
	}
	if !eventually(5*time.Second, func() bool { return len(clientHandshakes.since(hmark)) > 0 }) {
		t.Error("control: an xDS client failed to verify istiod, but gRPC logged no failed handshake: the check of this process's handshakes is blind")
	}
}

// tlsProbe completes a TLS handshake presenting pair and reads: with TLS
// 1.3 the server refuses a client certificate after the client's side of
// the handshake is done, so the refusal comes with the first read;
// accepted, gRPC's SETTINGS arrive. The certificate is sent whatever CAs
// the server names, as gRPC clients do.
func tlsProbe(addr, serverName string, roots *x509.CertPool, pair tls.Certificate) error {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{
		RootCAs: roots, ServerName: serverName, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }})
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
		return err
	}
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err = conn.Read(make([]byte, 9))
	return err
}

// clientCert is a workload certificate for the URI id under ca, with its
// key.
func clientCert(t testing.TB, ca *testca.CA, id string) tls.Certificate {
	t.Helper()
	u, err := url.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	return issueLeaf(t, ca, &x509.Certificate{URIs: []*url.URL{u}})
}

// issueLeaf signs tmpl's names under ca for a new P-256 key, valid for an
// hour, for server and client authentication.
func issueLeaf(t testing.TB, ca *testca.CA, tmpl *x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func eventually(timeout time.Duration, ok func() bool) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if ok() {
			return true
		}
	}
	return ok()
}
