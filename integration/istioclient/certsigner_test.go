package istioclient

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
)

// TestAgentCertSigner runs the real istio-agent with ISTIO_META_CERT_SIGNER
// set, which it sends as the CertSigner field of every request, against a
// meshca whose --cert-signers lists one name: the agent naming it gets its
// certificate, and meshca's audit says which backend signed; the agent
// naming another is refused with InvalidArgument and the message of
// docs/errors.md, which the agent logs at every retry, and meshca counts
// each refusal as unknown_cert_signer.
func TestAgentCertSigner(t *testing.T) {
	_, agentBin := istioBinaries(t)
	const listed, unlisted = "mesh-signer", "other-signer"
	s := startServer(t, "--cert-signers", listed)
	ns := cluster.Namespace(t, "cert-signer")

	began := time.Now()
	ok := startSignerAgent(t, s, agentBin, cluster.NewWorkload(t, ns, "listed", "node-a"), listed)
	chain := waitForFile(t, ok, filepath.Join(ok.out, "cert-chain.pem"), 30*time.Second)
	tookOK := time.Since(began)
	certs, err := pemutil.ParseCertificates(chain)
	if err != nil || len(certs) == 0 || len(certs[0].URIs) != 1 || certs[0].URIs[0].String() != ok.id {
		t.Fatalf("the agent naming %q wrote a chain of %d certificates (%v), want a leaf for %s", listed, len(certs), err, ok.id)
	}
	issued := auditEvents(s.Logs(), "issued", ok.id)
	if len(issued) == 0 || issued[0]["backend"] != "local" {
		t.Errorf("meshca's audit of the agent naming %q: %v, want an issued certificate, backend local", listed, issued)
	}

	began = time.Now()
	refused := startSignerAgent(t, s, agentBin, cluster.NewWorkload(t, ns, "unlisted", "node-a"), unlisted)
	want := fmt.Sprintf(`code = InvalidArgument desc = CertSigner %q names a signer this CA does not serve: `+
		`unset ISTIO_META_CERT_SIGNER in the proxy's configuration, or have the CA's operator add the name to --cert-signers`, unlisted)
	// Each refusal is one failed request in the agent's CA client's log;
	// two: the agent retries, and gets the same answer.
	refusal := "failed to sign CSR: create certificate: rpc error: " + want
	if !eventually(30*time.Second, func() bool { return strings.Count(refused.logs(), refusal) >= 2 }) {
		t.Fatalf("the agent naming %q does not log twice %q:\n%s", unlisted, refusal, refused.tail(20))
	}
	tookRefused := time.Since(began)
	refused.stop()
	if _, err := os.Stat(filepath.Join(refused.out, "cert-chain.pem")); err == nil {
		t.Errorf("the agent naming %q wrote a certificate", unlisted)
	}
	agentRefusals := strings.Count(refused.logs(), refusal)
	denied := auditEvents(s.Logs(), "denied", refused.id)
	for _, ev := range denied {
		if ev["code"] != "InvalidArgument" || ev["reason"] != "unknown_cert_signer" {
			t.Errorf("meshca's audit of the agent naming %q: %v, want code InvalidArgument, reason unknown_cert_signer", unlisted, ev)
		}
	}
	metric := requestsTotal(t, s.AdminAddr, "InvalidArgument", "unknown_cert_signer")
	// One more on meshca's side when the agent was stopped before it
	// logged the answer to its last request.
	if len(denied) < agentRefusals || len(denied) > agentRefusals+1 || metric != float64(len(denied)) {
		t.Errorf("the agent logged %d refusals; meshca audited %d and counts %v (meshca_requests_total{code=InvalidArgument,reason=unknown_cert_signer})",
			agentRefusals, len(denied), metric)
	}
	harness.Report(t, "CertSigner from the real istio-agent (ISTIO_META_CERT_SIGNER), meshca --cert-signers=%s: "+
		"%q certified in %v (audit: issued, backend %v; meshca_requests_total{code=OK} %v); "+
		"%q refused %d times in %v with InvalidArgument and the message of docs/errors.md in the agent's log, "+
		"audited as denied %d times, meshca_requests_total{code=InvalidArgument,reason=unknown_cert_signer} %v",
		listed, listed, tookOK.Round(time.Millisecond), auditField(issued, "backend"), requestsTotal(t, s.AdminAddr, "OK", "ok"),
		unlisted, agentRefusals, tookRefused.Round(time.Millisecond), len(denied), metric)
}

// signerAgent is an agent naming a signer, and the identity it asks for.
type signerAgent struct {
	*agent
	id string
}

// startSignerAgent runs the agent of w with ISTIO_META_CERT_SIGNER=name,
// meshca's roots mounted; it has no istiod to reach, and needs none for
// its certificate.
func startSignerAgent(t *testing.T, s *server, bin string, w *harness.Workload, name string) signerAgent {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, agentRootDir, "root-cert.pem"), s.rootsPEM)
	a := startAgent(t, bin, dir, w, s.Addr, "127.0.0.1:1", caSAN, "ISTIO_META_CERT_SIGNER="+name)
	return signerAgent{agent: a, id: spiffeID(w)}
}

// waitForFile waits until path exists and is not empty, and returns it.
func waitForFile(t *testing.T, a signerAgent, path string, timeout time.Duration) []byte {
	t.Helper()
	var data []byte
	if !eventually(timeout, func() bool {
		var err error
		data, err = os.ReadFile(path)
		return err == nil && len(data) > 0
	}) {
		t.Fatalf("%s not written within %v; the agent's log:\n%s", path, timeout, a.tail(20))
	}
	return data
}

// auditEvents are meshca's audit events of certificate requests with
// decision, whose caller is id.
func auditEvents(logs, decision, id string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `"audit":true`) {
			continue
		}
		var ev map[string]any
		if json.Unmarshal([]byte(line), &ev) == nil && ev["event"] == "certificate" && ev["decision"] == decision && ev["caller"] == id {
			out = append(out, ev)
		}
	}
	return out
}

func auditField(events []map[string]any, key string) any {
	if len(events) == 0 {
		return nil
	}
	return events[0][key]
}

// requestsTotal is meshca_requests_total{code,reason} on meshca's admin
// port now (0 when it was never counted).
func requestsTotal(t *testing.T, adminAddr, code, reason string) float64 {
	t.Helper()
	r, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^meshca_requests_total\{code="` + regexp.QuoteMeta(code) + `",reason="` + regexp.QuoteMeta(reason) + `"\} (\S+)$`)
	m := re.FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
