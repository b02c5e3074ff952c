package istioclient

// What the mesh's certificates and logs must show: every certificate the
// agent writes verifies against the bundle its namespace is published at
// that moment; no TLS handshake fails for a certificate, in this process's
// gRPC clients or in istiod.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/grpclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
)

// issued is one certificate the agent wrote, with the published root it
// verified to when it appeared.
type issued struct {
	at   time.Time
	leaf *x509.Certificate
	root *x509.Certificate
}

// certWatcher follows the agent's OUTPUT_CERTS.
type certWatcher struct {
	dir, namespace, id string

	mu       sync.Mutex
	last     []byte
	certs    []issued
	failures []string
}

// run looks at cert-chain.pem every 100 ms until ctx ends.
func (w *certWatcher) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
		raw, err := os.ReadFile(filepath.Join(w.dir, "cert-chain.pem"))
		if err != nil || bytes.Equal(raw, w.last) {
			continue
		}
		w.last = raw
		w.check(ctx, raw)
	}
}

// check verifies a new chain against the roots istio-ca-root-cert in the
// workload's namespace holds now, as a peer of the workload would.
func (w *certWatcher) check(ctx context.Context, raw []byte) {
	fail := func(format string, args ...any) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.failures = append(w.failures, fmt.Sprintf(format, args...))
	}
	chain, err := pemutil.ParseCertificates(raw)
	if err != nil || len(chain) == 0 {
		fail("cert-chain.pem does not parse: %v", err)
		return
	}
	leaf := chain[0]
	cm, err := cluster.Client.CoreV1().ConfigMaps(w.namespace).Get(ctx, rootConfigMap, metav1.GetOptions{})
	if err != nil {
		if ctx.Err() == nil {
			fail("certificate %x: reading istio-ca-root-cert: %v", leaf.SerialNumber, err)
		}
		return
	}
	roots, err := pemutil.ParseCertificates([]byte(cm.Data[rootKey]))
	if err != nil {
		fail("istio-ca-root-cert in %s: %v", w.namespace, err)
		return
	}
	verified, err := leaf.Verify(x509.VerifyOptions{Roots: certs.Pool(roots...), Intermediates: certs.Pool(chain[1:]...),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		fail("certificate %x (issuer %q) does not verify against the %d roots published to %s: %v",
			leaf.SerialNumber, leaf.Issuer, len(roots), w.namespace, err)
		return
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != w.id {
		fail("certificate %x names %v, want %s", leaf.SerialNumber, leaf.URIs, w.id)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.certs = append(w.certs, issued{at: time.Now(), leaf: leaf, root: verified[0][len(verified[0])-1]})
}

// latest is the last certificate written, once key.pem matches it (the
// agent writes key.pem, then cert-chain.pem: a client must not read a
// mismatched pair).
func (w *certWatcher) latest() (issued, bool) {
	w.mu.Lock()
	n := len(w.certs)
	var c issued
	if n > 0 {
		c = w.certs[n-1]
	}
	w.mu.Unlock()
	if n == 0 {
		return c, false
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(w.dir, "cert-chain.pem"), filepath.Join(w.dir, "key.pem"))
	return c, err == nil && bytes.Equal(pair.Certificate[0], c.leaf.Raw)
}

// waitUnder waits until the agent holds a certificate under root.
func (w *certWatcher) waitUnder(t *testing.T, root *x509.Certificate, timeout time.Duration) issued {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(100 * time.Millisecond) {
		if c, ok := w.latest(); ok && c.root.Equal(root) {
			return c
		}
		if time.Now().After(deadline) {
			latest := "none"
			if c, _ := w.latest(); c.leaf != nil {
				latest = fmt.Sprintf("written at %s under %q", c.at.Format(time.TimeOnly), c.root.Subject.CommonName)
			}
			t.Fatalf("the agent holds no certificate under root %q after %v (its latest: %s)", root.Subject.CommonName, timeout, latest)
		}
	}
}

func (w *certWatcher) results() (certs []issued, failures []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]issued(nil), w.certs...), append([]string(nil), w.failures...)
}

// handshakeLog keeps what gRPC logs about failed TLS handshakes of this
// process's clients: gRPC retries them silently, and logs each one
// ("authentication handshake failed") at warning level only.
type handshakeLog struct {
	mu    sync.Mutex
	lines []string
}

func (h *handshakeLog) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("handshake")) {
		h.mu.Lock()
		h.lines = append(h.lines, strings.TrimSpace(string(p)))
		h.mu.Unlock()
	}
	return len(p), nil
}

func (h *handshakeLog) mark() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.lines)
}

func (h *handshakeLog) since(mark int) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.lines[mark:]...)
}

var clientHandshakes = &handshakeLog{}

// gRPC's logger must be set before any gRPC use; errors still go to
// standard error, as with gRPC's default.
func init() {
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, clientHandshakes, os.Stderr))
}

// certErrorRe matches what istiod logs when a certificate or a TLS
// handshake fails, at any level: its peer verifier ("Could not verify
// certificate", info), gRPC's refused handshakes (grpc:info), a failed
// reload of its files.
var certErrorRe = regexp.MustCompile(`(?i)could not verify certificate|handshake|bad certificate|unknown authority|` +
	`certificate (signed by unknown|has expired|is not valid)|failed to verify|key pairs? failed|setting keycertbundle failed`)

// certWordRe matches a warning or error about certificates or TLS. At
// info level Istio names certificates all the time ("x509 cert -
// Issuer", "Istiod certificates are reloaded"), so only those levels
// count.
var certWordRe = regexp.MustCompile(`(?i)x509|tls:|certificate`)

// certErrors are the lines of an Istio process's log that report a
// certificate or TLS failure. Istio's lines are "time<TAB>level<TAB>...".
func certErrors(log string) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		fields := strings.SplitN(line, "\t", 3)
		warned := len(fields) == 3 && (fields[1] == "warn" || fields[1] == "error")
		if certErrorRe.MatchString(line) || (warned && certWordRe.MatchString(line)) {
			out = append(out, line)
		}
	}
	return out
}
