package serve_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/self"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// switchable is the self upstream, which the test can make fail.
type switchable struct {
	*upstream.KeySigned
	down atomic.Bool
}

func (s *switchable) SignIntermediate(ctx context.Context, req *upstream.Request) (*upstream.Response, error) {
	if s.down.Load() {
		return nil, &upstream.Error{Upstream: self.Name, Kind: upstream.KindUnavailable, Err: errors.New("sealed")}
	}
	return s.KeySigned.SignIntermediate(ctx, req)
}

// opener hands the assembly its upstream.
type opener struct{ u *switchable }

func (o opener) Name() string { return self.Name }

func (o opener) Open(context.Context, serve.UpstreamEnv) (upstream.Upstream, error) { return o.u, nil }

// auditLog keeps the audit events.
type auditLog struct {
	mu     sync.Mutex
	events []ca.AuditEvent
}

func (a *auditLog) Audit(_ context.Context, e *ca.AuditEvent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, *e)
}

func (a *auditLog) count(event, decision string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, e := range a.events {
		if e.Event == event && e.Decision == decision {
			n++
		}
	}
	return n
}

// find is the first event ok accepts.
func (a *auditLog) find(ok func(ca.AuditEvent) bool) (ca.AuditEvent, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.events {
		if ok(e) {
			return e, true
		}
	}
	return ca.AuditEvent{}, false
}

// upstreamConfig is config with the self upstream renewing intermediates
// of ttl every 100 ms of looking, leaves of a second.
func upstreamConfig(t *testing.T, ttl time.Duration) (serve.Config, *switchable, *auditLog) {
	c := config(t)
	u := &switchable{KeySigned: self.New()}
	c.Backend.Upstream = &serve.Upstream{Opener: opener{u}, TTL: ttl, Interval: 100 * time.Millisecond}
	c.DefaultTTL = time.Second
	audit := &auditLog{}
	c.Audit = audit
	return c, u, audit
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// TestAssembleUpstreamRenews: with the self upstream, the first start
// makes a root and its first intermediate; leaves carry the intermediate
// and verify to the bundle; it is renewed within its life, each renewal
// audited, the bundle unchanged, and the leaves carry the renewal.
func TestAssembleUpstreamRenews(t *testing.T) {
	c, _, audit := upstreamConfig(t, 6*time.Second)
	p := start(t, c)
	store := &dirstore.Store{Dir: c.Backend.StateDir}
	st, _, err := store.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	first := st.Active()
	if !first.Renewed() || first.RootKey == nil || first.SignsWithRoot() {
		t.Fatal("the first start did not make a root of the self upstream and an intermediate under it")
	}
	cl := client(t, p, c, token, nil)
	svid, err := cl.Fetch(t.Context(), web, caclient.Options{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(svid.Chain) != 2 || svid.Chain[1].CheckSignatureFrom(first.Root) != nil || len(svid.Roots) != 1 || !svid.Roots[0].Equal(first.Root) {
		t.Fatal("the leaf does not come with its intermediate under the one root")
	}
	inter := svid.Chain[1]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		svid, err = cl.Fetch(t.Context(), web, caclient.Options{TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if !svid.Chain[1].Equal(inter) && svid.Chain[1].CheckSignatureFrom(first.Root) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no renewal within 10s of an intermediate of 6s")
		}
	}
	if len(svid.Roots) != 1 || !svid.Roots[0].Equal(first.Root) {
		t.Fatal("a renewal changed the bundle")
	}
	if audit.count(ca.EventIntermediate, ca.DecisionIssued) == 0 {
		t.Fatal("no audit event for the intermediate issued")
	}
	_, metrics := get(t, "http://"+p.Addresses().Admin+"/metrics")
	for _, m := range []string{`meshca_intermediate_expiry_timestamp{upstream="self"}`, `meshca_intermediate_renewals_total{result="ok",upstream="self"}`,
		`meshca_intermediate_renewal_failures{upstream="self"} 0`} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}

// TestAssembleUpstreamAway: while the upstream fails, the intermediate
// keeps signing, /readyz says why on its ok line, then fails as it nears
// its end, and requests are refused as Unavailable saying why; the
// upstream back, a renewal is made without a restart.
func TestAssembleUpstreamAway(t *testing.T) {
	c, u, audit := upstreamConfig(t, 8*time.Second)
	p := start(t, c)
	u.down.Store(true)
	cl := client(t, p, c, token, nil)
	ready := "http://" + p.Addresses().Admin + "/readyz"
	var sawDegraded, sawRefusal, sawUnready bool
	for deadline := time.Now().Add(15 * time.Second); !sawDegraded || !sawRefusal || !sawUnready; time.Sleep(50 * time.Millisecond) {
		code, body := get(t, ready)
		switch {
		case code == http.StatusOK && strings.Contains(body, "[+]upstream ok: renewal from upstream self failing for"):
			sawDegraded = true
		case code == http.StatusServiceUnavailable && strings.Contains(body, "[-]upstream failed") && strings.Contains(body, "too soon to issue certificates"):
			sawUnready = true
		}
		_, err := cl.Fetch(t.Context(), web, caclient.Options{TTL: 2 * time.Second})
		if status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "too soon to issue a certificate") &&
			strings.Contains(err.Error(), "upstream self failing since") && !strings.Contains(err.Error(), "sealed") {
			sawRefusal = true
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 15s: /readyz naming the failing upstream %v, then failing %v; a request refused saying why %v", sawDegraded, sawUnready, sawRefusal)
		}
	}
	if audit.count(ca.EventIntermediate, ca.DecisionRefused) == 0 {
		t.Fatal("no audit event for the failed renewal")
	}
	u.down.Store(false)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := cl.Fetch(t.Context(), web, caclient.Options{TTL: 2 * time.Second}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the upstream back, still no certificate after 15s")
		}
	}
}

// TestAssembleUpstreamTakesOver: a CA state whose root signs by itself,
// started with the self upstream, moves to an intermediate under that
// root.
func TestAssembleUpstreamTakesOver(t *testing.T) {
	c, _, _ := upstreamConfig(t, time.Hour)
	store := &dirstore.Store{Dir: c.Backend.StateDir}
	before, err := keymgr.LoadOrBootstrap(t.Context(), store, func() (*keymgr.AuthorityRecord, error) {
		a, err := keymgr.NewRoot(keymgr.RootOptions{Organization: "cluster.local"})
		if err != nil {
			return nil, err
		}
		return &keymgr.AuthorityRecord{Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true}, nil
	}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st, _, err := store.Load(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if a := st.Active(); a.Renewed() && a.Root.Equal(before.Active().Root) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the root was not taken over within 10s")
		}
	}
}

func TestAssembleUpstreamRefused(t *testing.T) {
	c, _, _ := upstreamConfig(t, time.Hour)
	c.Backend.StateDir, c.Backend.CADir = "", t.TempDir()
	_, err := serve.Assemble(t.Context(), c)
	var fe *serve.FieldError
	if !errors.As(err, &fe) || fe.Field != "upstream" || !strings.Contains(err.Error(), "plugged-in CA") {
		t.Fatalf("err = %v, want the upstream refused with a plugged-in CA", err)
	}
}
