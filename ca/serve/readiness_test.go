package serve

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/signer"
)

// clock is a settable clock for the trackers.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }

// logBuf is a text logger and what it wrote.
func logBuf() (*slog.Logger, *bytes.Buffer) {
	var b bytes.Buffer
	return slog.New(slog.NewTextHandler(&b, nil)), &b
}

type expiryAt time.Time

func (e expiryAt) RootNotAfter() time.Time  { return time.Time(e) }
func (e expiryAt) ChainNotAfter() time.Time { return time.Time(e) }

// readyz asks the admin handler over r for /readyz.
func readyz(t *testing.T, r ca.Readiness) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	ca.AdminHandler(prometheus.NewRegistry(), r).ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	return w.Code, w.Body.String()
}

// TestReadyzNamesTheMissingDependency: /readyz lists every check with
// its state, and answers 503 when any fails, naming it; the gRPC health
// (Readiness.Ready) agrees.
func TestReadyzNamesTheMissingDependency(t *testing.T) {
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	log, _ := logBuf()
	authority := &x509.Certificate{Subject: pkix.Name{CommonName: "root"}, NotBefore: clk.now().Add(-time.Hour)}
	type world struct {
		synced  bool
		watch   error
		signing *x509.Certificate
		expiry  time.Time
		backend func(h *backendHealth)
	}
	good := world{synced: true, signing: authority, expiry: clk.now().Add(time.Hour)}
	for _, tc := range []struct {
		name   string
		change func(w *world)
		code   int
		want   []string
	}{
		{"all good", func(*world) {}, 200, []string{"[+]pod-cache ok\n", "[+]ca-state ok\n", "[+]signer ok\n", "readyz check passed\n"}},
		{"pod cache never synced", func(w *world) { w.synced, w.watch = false, errors.New("connection refused") }, 503, []string{
			`[-]pod-cache failed: the Pod cache of cluster "Kubernetes" has not synced: list/watch failing for 0s: connection refused`,
			"[+]ca-state ok\n", "[+]signer ok\n", "readyz check failed\n"}},
		{"pod cache synced, watch failing", func(w *world) { w.watch = errors.New("connection refused") }, 200, []string{
			"[+]pod-cache ok: synced, but list/watch failing for 0s: connection refused\n"}},
		{"no CA state", func(w *world) { w.signing = nil }, 503, []string{"[+]pod-cache ok\n", "[-]ca-state failed: no CA state in service\n"}},
		{"authority expired", func(w *world) { w.expiry = clk.now().Add(-time.Minute) }, 503, []string{`[-]ca-state failed: active authority "CN=root" expired at 2029-12-31T23:59:00Z`}},
		{"authority not yet valid", func(w *world) {
			c := *authority
			c.NotBefore = clk.now().Add(time.Minute)
			w.signing = &c
		}, 503, []string{`[-]ca-state failed: active authority "CN=root" is not valid before`}},
		{"backend never worked", func(w *world) {
			w.backend = func(h *backendHealth) { h.Failed(errors.New("no Vault token: the login failed or lapsed")) }
		}, 503, []string{"[-]signer failed: vault has not worked since start (failing for 0s): no Vault token"}},
		{"a Vault login's error says why", func(w *world) {
			w.backend = func(h *backendHealth) {
				h.Reason(errors.New("revoking the replaced token: 500")) // healthy: no news
				h.Failed(errors.New("no Vault token: the login failed or lapsed"))
				h.Reason(errors.New("permission denied"))
			}
		}, 503, []string{"[-]signer failed: vault has not worked since start (failing for 0s): permission denied\n"}},
		{"backend failing within its grace", func(w *world) {
			w.backend = func(h *backendHealth) {
				h.Worked()
				h.ObserveSign("vault", 0, signer.Errorf("vault", signer.KindUnavailable, "sealed"))
				clk.add(10 * time.Second)
			}
		}, 200, []string{"[+]signer ok: vault failing for 10s (unready after 30s): signer vault: unavailable: sealed\n"}},
		{"backend failing past its grace", func(w *world) {
			w.backend = func(h *backendHealth) {
				h.Worked()
				h.ObserveSign("vault", 0, signer.Errorf("vault", signer.KindUnavailable, "sealed"))
				clk.add(31 * time.Second)
			}
		}, 503, []string{"[-]signer failed: vault failing for 31s: signer vault: unavailable: sealed\n"}},
		{"backend recovered", func(w *world) {
			w.backend = func(h *backendHealth) {
				h.ObserveSign("vault", 0, signer.Errorf("vault", signer.KindUnavailable, "sealed"))
				clk.add(time.Minute)
				h.ObserveSign("vault", 0, nil)
			}
		}, 200, []string{"[+]signer ok\n"}},
		{"refusals and cancellations are no outage", func(w *world) {
			w.backend = func(h *backendHealth) {
				h.ObserveSign("vault", 0, signer.Errorf("vault", signer.KindRefused, "role forbids"))
				h.ObserveSign("vault", 0, context.Canceled)
			}
		}, 200, []string{"[+]signer ok\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := good
			tc.change(&w)
			watch := newAPIWatch(ca.DefaultClusterID, func() bool { return w.synced }, nil, log, clk.now)
			watch.fail(w.watch)
			h := newBackendHealth("vault", nil, log, clk.now)
			if w.backend != nil {
				w.backend(h)
			}
			be := &backend{signing: func() *x509.Certificate { return w.signing }, expiry: expiryAt(w.expiry), health: h}
			r := readiness(&clusterParts{watch: watch}, be)
			for i := range r {
				if r[i].Name == "ca-state" {
					r[i].Check = caStateCheck(be, clk.now)
				}
			}
			code, body := readyz(t, r)
			if code != tc.code {
				t.Errorf("/readyz %d, want %d:\n%s", code, tc.code, body)
			}
			for _, s := range tc.want {
				if !strings.Contains(body, s) {
					t.Errorf("/readyz body lacks %q:\n%s", s, body)
				}
			}
			if err := r.Ready(); (err == nil) != (tc.code == 200) {
				t.Errorf("Ready() = %v with /readyz %d", err, code)
			}
		})
	}
}

// TestReadyzWithoutStateOrExternalBackend: pinned trust anchors have no
// ca-state check, the in-process backends no signer check.
func TestReadyzWithoutStateOrExternalBackend(t *testing.T) {
	log, _ := logBuf()
	watch := newAPIWatch("c1", func() bool { return true }, nil, log, nil)
	code, body := readyz(t, readiness(&clusterParts{watch: watch}, &backend{}))
	if code != 200 || body != "[+]pod-cache ok\nreadyz check passed\n" {
		t.Errorf("/readyz %d %q", code, body)
	}
}

// TestAPIWatchWarnsOnceAMinute: list/watch failures are logged at warn
// at most once a minute while they last, with how long and how many;
// an outage ends, logged at info, once a probe sees the apiserver answer
// with the cache synced.
func TestAPIWatchWarnsOnceAMinute(t *testing.T) {
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	log, out := logBuf()
	synced := false
	var probeErr error = errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	w := newAPIWatch("c1", func() bool { return synced }, func(context.Context) error { return probeErr }, log, clk.now)
	warns := func() int { return strings.Count(out.String(), "level=WARN") }

	w.check(context.Background()) // too early to call a slow first list a failure
	if out.Len() != 0 {
		t.Fatalf("logged before anything failed:\n%s", out)
	}
	refused := errors.New(`Get "https://127.0.0.1:6443/api/v1/pods": connection refused`)
	w.fail(refused)
	if warns() != 1 || !strings.Contains(out.String(), "the Pod cache has not synced, not ready") {
		t.Fatalf("first failure not warned:\n%s", out)
	}
	for range 5 { // the reflector retries: quiet for a minute
		clk.add(10 * time.Second)
		w.fail(refused)
	}
	w.fail(io.EOF) // a watch ending normally is no failure
	if warns() != 1 {
		t.Fatalf("warned again within a minute:\n%s", out)
	}
	clk.add(10 * time.Second) // 60 s on
	w.check(context.Background())
	if warns() != 2 || !strings.Contains(out.String(), "failing_for=1m0s failures=6") {
		t.Fatalf("second warning a minute on, with the failures since the first, missing:\n%s", out)
	}
	// The apiserver answers; the informer lists.
	probeErr, synced = nil, true
	clk.add(10 * time.Second)
	w.check(context.Background())
	if !strings.Contains(out.String(), `level=INFO msg="apiserver reachable again" cluster=c1 after=1m10s`) {
		t.Fatalf("recovery not logged:\n%s", out)
	}
	if err := w.ready(); err != nil {
		t.Fatalf("ready after recovery: %v", err)
	}
	// Another outage within a minute of the last warning waits its turn.
	w.fail(refused)
	if warns() != 2 {
		t.Fatalf("warned within a minute of the last warning:\n%s", out)
	}
	clk.add(time.Minute)
	w.fail(refused)
	if warns() != 3 || !strings.Contains(out.String(), "apiserver unreachable: the Pod cache is not kept up to date") {
		t.Fatalf("the later outage not warned:\n%s", out)
	}
	// A first list that never completes, without any error, is a failure
	// too after syncGrace.
	log2, out2 := logBuf()
	w2 := newAPIWatch("c2", func() bool { return false }, func(context.Context) error { return nil }, log2, clk.now)
	clk.add(syncGrace)
	w2.check(context.Background())
	if !strings.Contains(out2.String(), "the Pod cache has not synced in 10s") {
		t.Fatalf("a stuck first list not warned:\n%s", out2)
	}
}
