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
	certs, certFailures := m.certs.results()
	rollouts, pods, depErrs := m.dep.snapshot()
	tlsConns, ends, reconnects := m.xds.counts()
	handshakes := clientHandshakes.since(m.handshakeMark)
	var istiodErrs []string
	for _, p := range pods {
		for _, line := range certErrors(p.logs()) {
			istiodErrs = append(istiodErrs, p.name+": "+line)
		}
	}
	atRestart, agentErrs := m.agentCertErrors()
	m.controls() // after the figures: the controls fail on purpose

	for _, f := range []struct {
		what string
		bad  []string
	}{
		{"agent certificates that did not verify against istio-ca-root-cert when written", certFailures},
		{"held streams that ended outside an istiod rollout", m.xds.unattributed(rollouts)},
		{"TLS handshakes this process's xDS clients failed", handshakes},
		{"certificate or TLS errors in istiod's logs", istiodErrs},
		{"certificate or TLS errors in the agent's log, besides its CA client's after meshca's restart", agentErrs},
		{"errors of the Deployment controller stand-in", depErrs},
		{"errors of the kubelet stand-in", m.kube.errors()},
	} {
		if len(f.bad) > 0 {
			t.Errorf("%d %s:\n%s", len(f.bad), f.what, strings.Join(f.bad, "\n"))
		}
	}
	renewals := len(certs) - 1
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
		"agent certificates renewed %d, each verified against istio-ca-root-cert when written (%d failed); "+
		"xDS clients opened %d (%s; one through the agent), held at the end %d (%d closed as their bundle lost istiod's root), "+
		"TLS connections to istiod %d, stream ends %d, all at istiod restarts, reconnects %d; "+
		"istiod restarts %d (%s), istiod's Secret rewritten %d times under running Pods; "+
		"refusals before passing: activate %d, retire %d, never forced; TLS failures: xDS clients %d, istiod %d (detectors checked); "+
		"agent CA requests refused by the agent's stale CA_ROOT_CA after meshca's restart %d",
		time.Since(began).Round(time.Second), renewals, len(certFailures), len(m.xds.clients), m.xds.perPhase(), len(m.xds.held()), m.xds.dropped,
		tlsConns, ends, reconnects, m.dep.restarts(), strings.Join(took, ", "), len(m.rewritten()),
		len(m.refusals["activate"]), len(m.refusals["retire"]), len(handshakes), len(istiodErrs), len(atRestart))
}

// agentCertErrors splits the certificate and TLS errors of the agent's
// log: its CA client's in the minute after meshca's restart, one per
// request (Istio's citadel client dials again with the CA_ROOT_CA it read
// when it last connected, and reads it anew only after a request failed,
// while meshca now serves a certificate under the root activated since),
// and all the others.
func (m *mesh) agentCertErrors() (atRestart, others []string) {
	for _, line := range certErrors(m.agent.logs()) {
		stamp, _, _ := strings.Cut(line, "\t")
		at, err := time.Parse(time.RFC3339Nano, stamp)
		afterRestart := err == nil && !m.meshcaRestartedAt.IsZero() && !at.Before(m.meshcaRestartedAt) &&
			at.Before(m.meshcaRestartedAt.Add(time.Minute))
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
