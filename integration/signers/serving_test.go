package signers

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/secretvolume"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// servingName is the name ztunnel dials meshca by (CA_ADDRESS).
const servingName = "istiod.istio-system.svc"

// writeServing writes a serving certificate for servingName, issued by
// issuer at now for ttl, as the next version of the Secret volume dir, as
// the kubelet does when cert-manager renews the Secret.
func writeServing(t *testing.T, dir string, issuer *testca.CA, now time.Time, ttl time.Duration) *x509.Certificate {
	t.Helper()
	c, err := keymgr.IssueServing(issuer.Authority(), keymgr.ServingOptions{Names: []string{servingName}, Now: now, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pemutil.EncodePrivateKey(c.PrivateKey.(crypto.Signer))
	if err != nil {
		t.Fatal(err)
	}
	if err := secretvolume.Write(dir, map[string][]byte{"tls.crt": pemutil.EncodeCertificates(c.Leaf, issuer.Cert), "tls.key": key}); err != nil {
		t.Fatal(err)
	}
	return c.Leaf
}

// handshake is one request of the load: when it began, when its TLS
// handshake verified meshca's serving certificate, and which one it was.
type handshake struct {
	began, verified time.Time
	serial          string
}

// servingLoad is ztunnel-shaped load on meshca: workers asking for SVIDs
// in a loop, each request over a fresh TLS connection that verifies
// meshca's serving certificate against the root and servingName, as
// ztunnel does.
type servingLoad struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	done     []handshake
	failures []string
}

func startServingLoad(t *testing.T, m *harness.Meshca, root *x509.Certificate, workers int) *servingLoad {
	l := &servingLoad{stop: make(chan struct{})}
	ns := cluster.Namespace(t, "serving-load")
	for i := range workers {
		w := cluster.NewWorkload(t, ns, fmt.Sprintf("load-%d", i), "node-a")
		id := spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", w.Namespace, "sa", w.ServiceAccount)
		cfg := caclient.Config{Addr: m.Addr, ServerName: servingName, Roots: certs.Pool(root), TokenFile: harness.WriteToken(t, w.Token)}
		l.wg.Go(func() { l.work(t, cfg, id) })
	}
	t.Cleanup(l.halt)
	return l
}

func (l *servingLoad) work(t *testing.T, cfg caclient.Config, id spiffeid.ID) {
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		h := handshake{began: time.Now()}
		var hmu sync.Mutex // the handshake runs on gRPC's goroutine
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			hmu.Lock()
			defer hmu.Unlock()
			h.verified, h.serial = time.Now(), fmt.Sprintf("%x", cs.PeerCertificates[0].SerialNumber)
			return nil
		}
		c, err := checked.NewClient(t, cfg)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err = c.Fetch(ctx, id, caclient.Options{})
			cancel()
			c.Close()
		}
		hmu.Lock()
		got := h
		hmu.Unlock()
		l.mu.Lock()
		if err != nil {
			l.failures = append(l.failures, err.Error())
		} else {
			l.done = append(l.done, got)
		}
		l.mu.Unlock()
	}
}

// halt stops the workers and waits for them.
func (l *servingLoad) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// snapshot is every request done so far, and the failures.
func (l *servingLoad) snapshot() ([]handshake, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]handshake(nil), l.done...), append([]string(nil), l.failures...)
}

// waitFor waits until the requests done satisfy cond.
func (l *servingLoad) waitFor(t *testing.T, within time.Duration, what string, cond func([]handshake) bool) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		done, failures := l.snapshot()
		if cond(done) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %s within %v: %d requests done, %d failed (%v)", what, within, len(done), len(failures), failures)
		}
	}
}

// count is how many of hs got serial and began after since.
func count(hs []handshake, serial string, since time.Time) int {
	n := 0
	for _, h := range hs {
		if h.serial == serial && !h.began.Before(since) {
			n++
		}
	}
	return n
}

func adminGet(t *testing.T, m *harness.Meshca, path string) (int, string) {
	t.Helper()
	r, err := http.Get("http://" + m.AdminAddr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// TestServingCertRenewedUnderLoad: with a remote cfssl (meshca holds no
// CA key, so its serving certificate is the operator's, in a Secret volume
// cert-manager renews), a renewed certificate is served to new handshakes
// within a follow interval while ztunnel-shaped clients issue
// continuously over fresh TLS connections, with no failed handshake; an
// expired replacement is then refused loudly (log, metric, /readyz) while
// the renewed one keeps serving. Remote cfssl is the cheapest real external
// backend to run: `cfssl serve` starts in milliseconds with its CA files,
// where Vault needs its PKI mount and roles configured and k8scsr a
// signing controller; the serving certificate's path is the same for all.
func TestServingCertRenewedUnderLoad(t *testing.T) {
	p := newPKI(t)
	srv := harness.StartCfssl(t, cfsslBin, p.inter.Authority(), harness.CfsslOptions{})
	vol := filepath.Join(t.TempDir(), "serving")
	first := writeServing(t, vol, p.inter, time.Now(), time.Hour)
	m := harness.StartMeshca(t, bin, "--signer", "cfssl", "--cfssl-url", srv.URL, "--kubeconfig", cluster.Kubeconfig,
		"--trust-anchors", p.path("anchors.pem"),
		"--serving-cert-file", filepath.Join(vol, "tls.crt"), "--serving-key-file", filepath.Join(vol, "tls.key"))
	serial := func(c *x509.Certificate) string { return fmt.Sprintf("%x", c.SerialNumber) }
	load := startServingLoad(t, m, p.root.Cert, 4)
	const enough = 40
	load.waitFor(t, 60*time.Second, "warmed up", func(hs []handshake) bool { return count(hs, serial(first), time.Time{}) >= enough })

	// cert-manager renews the Secret; the kubelet swaps the volume.
	renewed := writeServing(t, vol, p.inter, time.Now(), 2*time.Hour)
	swapped := time.Now()
	var seen time.Time
	load.waitFor(t, 30*time.Second, "serving the renewed certificate", func(hs []handshake) bool {
		for _, h := range hs {
			if h.serial == serial(renewed) && (seen.IsZero() || h.verified.Before(seen)) {
				seen = h.verified
			}
		}
		return !seen.IsZero() && count(hs, serial(renewed), time.Time{}) >= enough
	})
	if !m.WaitForLog(5*time.Second, `"serving certificate reloaded"`, `"serial":"`+serial(renewed)+`"`) {
		t.Errorf("no log line of the reload:\n%s", m.Logs())
	}

	// A replacement that expired is refused; the renewed one serves on.
	mark := m.LogMark()
	writeServing(t, vol, p.inter, time.Now().Add(-3*time.Hour), time.Hour)
	refusedAt := time.Now()
	if !m.WaitForLogAfter(mark, 15*time.Second, `"serving certificate not reloaded: the last good one keeps serving"`, `"reason":"expired"`,
		`"serving_serial":"`+serial(renewed)+`"`) {
		t.Fatalf("the expired replacement was not refused in the log:\n%s", m.Logs())
	}
	_, metrics := adminGet(t, m, "/metrics")
	for _, want := range []string{`meshca_serving_certificate_reloads_total{result="expired"} 1`,
		`meshca_serving_certificate_reloads_total{result="reloaded"} 1`, "meshca_serving_certificate_reload_failing 1",
		fmt.Sprintf("meshca_serving_certificate_expiry_timestamp_seconds %g", float64(renewed.NotAfter.Unix()))} {
		if !strings.Contains(metrics, "\n"+want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	code, readyz := adminGet(t, m, "/readyz")
	wantReady := "[+]serving-cert ok: serving the last good certificate, which expires at " + renewed.NotAfter.UTC().Format(time.RFC3339) +
		"; its files hold a pair that is refused: "
	if code != http.StatusOK || !strings.Contains(readyz, wantReady) || !strings.Contains(readyz, ": expired at ") {
		t.Errorf("/readyz %d, want 200 saying %q and why:\n%s", code, wantReady, readyz)
	}
	load.waitFor(t, 60*time.Second, "served after the refusal", func(hs []handshake) bool {
		return count(hs, serial(renewed), refusedAt) >= enough
	})
	load.halt()

	done, failures := load.snapshot()
	if len(failures) > 0 {
		t.Errorf("%d requests failed, want none: %v", len(failures), failures)
	}
	staleAfterSwap := count(done, serial(first), seen)
	for _, h := range done {
		if h.serial != serial(first) && h.serial != serial(renewed) {
			t.Errorf("a handshake got serial %s, neither the first certificate nor the renewed one", h.serial)
		}
		if !h.began.Before(refusedAt) && h.serial != serial(renewed) {
			t.Errorf("a handshake begun after the expired replacement got serial %s, want the renewed %s", h.serial, serial(renewed))
		}
	}
	if staleAfterSwap > 0 {
		t.Errorf("%d handshakes begun after the renewed certificate was first served still got the first one", staleAfterSwap)
	}
	afterRefusal := len(done) - countBefore(done, refusedAt)
	harness.Report(t, "serving certificate renewed under load (remote cfssl, 4 clients, a fresh TLS connection per request): "+
		"%d handshakes with the first certificate, %d with the renewed one (%d of them after an expired replacement was refused), "+
		"%d failed; renewed certificate in handshakes %v after the volume swap (follow interval %v); expired replacement refused: "+
		"log, meshca_serving_certificate_reloads_total{result=\"expired\"} 1, reload_failing 1, /readyz 200 saying so",
		count(done, serial(first), time.Time{}), count(done, serial(renewed), time.Time{}), afterRefusal, len(failures),
		seen.Sub(swapped).Round(time.Millisecond), keymgr.DefaultFollowInterval)
}

// countBefore is how many of hs began before t.
func countBefore(hs []handshake, t time.Time) int {
	n := 0
	for _, h := range hs {
		if h.began.Before(t) {
			n++
		}
	}
	return n
}
