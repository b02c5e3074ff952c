package e2e

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// newBudgetArena is a meshca of its own with budgets small enough to spend
// in a test: a workload's burst of 3, a node proxy's of 40, 5 failed
// authentications per address refilled one every 2 s, 2 streams per
// connection, 4 connections per address and 20 in all; on the admin port
// 3 connections per address and 6 in all.
func newBudgetArena(t *testing.T) *arena {
	m := newMesh(t, append([]string{"--authn-failure-burst-per-peer", "5", "--authn-failure-rate-per-peer", "0.5",
		"--caller-burst", "3", "--caller-rate", "0.01", "--node-proxy-burst", "40", "--node-proxy-rate", "0.01",
		"--max-concurrent-streams", "2", "--max-connections-per-peer", "4", "--max-connections", "20"}, adminCapFlags...)...)
	a := &arena{mesh: m, roots: m.s.roots}
	a.web, a.webID = cluster.NewWorkload(t, m.apps, "web", "node-a"), m.id("web")
	a.secret(a.web.Token, m.ztunnelA.Token, m.ztunnelB.Token)
	return a
}

// own asks for w's own identity with its token.
func (a *arena) own(t *testing.T, w *harness.Workload, from string) probe {
	return probe{token: w.Token, from: from, req: &authpb.IstioCertificateRequest{Csr: newCSR(t, workloadID(w)), ValidityDuration: 3600}}
}

// impersonate has a node proxy ask for id.
func impersonate(t *testing.T, token string, id spiffeid.ID) probe {
	return probe{token: token, req: &authpb.IstioCertificateRequest{Csr: newCSR(t, id),
		Metadata: meta(authpb.MetaImpersonatedIdentity, structpb.NewStringValue(id.String()))}}
}

// budgetRateAttacks: the budgets of callers and node proxies, spent in the
// row's before; the request after is refused at once, audited, and
// issues nothing.
func (b *arena) budgetRateAttacks(t *testing.T) []attack {
	eager := cluster.NewWorkload(t, b.apps, "eager", "node-a")
	b.secret(eager.Token)
	for i := range 5 {
		sa := fmt.Sprintf("pod-%d", i)
		cluster.ServiceAccount(t, b.apps, sa)
		cluster.Pod(t, b.apps, sa+"-0", sa, "node-a")
	}
	pod := func(i int) spiffeid.ID { return b.id(fmt.Sprintf("pod-%d", i%5)) }
	// spend sends n requests, which must be served.
	spend := func(t *testing.T, n int, p func(i int) probe) {
		for i := range n {
			if _, err := b.send(context.Background(), p(i)); err != nil {
				t.Fatalf("request %d spending the budget: %v", i+1, err)
			}
		}
	}
	const RE = codes.ResourceExhausted
	return []attack{
		{name: "budget/a workload past its burst", code: RE, msg: "this identity is over its request rate (0.01 a second, bursts of 3)",
			reason: "caller_rate", before: func(t *testing.T) { spend(t, 3, func(int) probe { return b.own(t, eager, "") }) },
			do: b.do(b.own(t, eager, ""))},
		{name: "budget/a node proxy past its burst", code: RE, msg: "this node proxy is over its request rate (0.01 a second, bursts of 40)",
			reason: "node_proxy_rate", do: b.do(impersonate(t, b.ztunnelA.Token, pod(0))), before: func(t *testing.T) {
				spend(t, 40, func(i int) probe { return impersonate(t, b.ztunnelA.Token, pod(i)) })
			}},
	}
}

// attempt makes p with request id rid and a deadline, and returns its
// status, how long it took, and its audit reason.
func (a *arena) attempt(t *testing.T, rid string, p probe, deadline time.Duration) (*status.Status, time.Duration, string) {
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-request-id", rid), deadline)
	defer cancel()
	start := time.Now()
	_, err := a.send(ctx, p)
	took := time.Since(start)
	reason := ""
	if ev := a.auditEvent(t, rid); ev != nil {
		reason, _ = ev["reason"].(string)
	}
	return status.Convert(err), took, reason
}

// connFrom is a gRPC connection to a's meshca from the address from.
func (a *arena) connFrom(t *testing.T, from string) *grpc.ClientConn {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: a.roots, ServerName: "istiod.istio-system.svc"}
	conn, err := grpc.NewClient(a.s.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)), grpc.WithContextDialer(dialFrom(from)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// served makes w's request from the address from, which must issue
// exactly w's identity.
func (a *arena) served(t *testing.T, w *harness.Workload, from string) {
	id := workloadID(w)
	key, csrPEM := newKeyAndCSR(t, id)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := a.send(ctx, probe{token: w.Token, from: from, req: &authpb.IstioCertificateRequest{Csr: csrPEM, ValidityDuration: 3600}})
	if err != nil {
		t.Fatalf("%s from %s: %v after %v", id, from, err, time.Since(start).Round(time.Millisecond))
	}
	if _, err := checked.Check(t, resp.GetCertChain(), id, key); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s from %s served in %v", id, from, time.Since(start).Round(time.Millisecond))
}

// lookupCheck: a node proxy asking for Pods its node does not run, each
// a miss of the Pod index that costs an apiserver lookup, spends its
// node's share of them (bursts of 20) and is then refused at once,
// before a lookup; other nodes keep theirs.
func (b *arena) lookupCheck() check {
	return check{name: "budget/a node proxy asking for Pods its node does not run", defence: "node_pod_lookups", run: func(t *testing.T) {
		before := b.counters(t)
		for i := range 40 {
			rid := fmt.Sprintf("lookup-%d", i)
			st, took, reason := b.attempt(t, rid, impersonate(t, b.ztunnelB.Token, b.id(fmt.Sprintf("made-up-%d", i))), 10*time.Second)
			if st.Code() == codes.PermissionDenied && reason == "not_on_node" {
				continue
			}
			if st.Code() != codes.ResourceExhausted || reason != "node_pod_lookups" ||
				!strings.Contains(st.Message(), "too many requests for Pods this node does not run") || took > time.Second || i < 20 {
				t.Fatalf("lookup %d: %v %q after %v, audit reason %q; want PermissionDenied not_on_node, then, past 20, "+
					"ResourceExhausted node_pod_lookups at once", i+1, st.Code(), st.Message(), took, reason)
			}
			if after := b.counters(t); after.issued != before.issued || after.signed != before.signed {
				t.Errorf("issued %v, signed %v while refusing", after.issued-before.issued, after.signed-before.signed)
			}
			if v := sampleValue(scrapeMetrics(t, b.s.AdminAddr), "meshca_rate_limited_total", "reason", "node_pod_lookups"); v < 1 {
				t.Errorf("meshca_rate_limited_total{reason=node_pod_lookups} = %v, want at least 1", v)
			}
			t.Logf("refused after %d lookups", i)
			return
		}
		t.Fatal("40 lookups, none refused")
	}}
}

// budgetChecks: a node's lookups (lookupCheck), then forged tokens from
// one address, beside workloads that share it. The address's failures
// are spent and the flood refused (peer_authn_failures), at once, before
// its reviews reach the apiserver; the workloads at that address are
// still served, whether their tokens were reviewed before or not, and so
// is every other address.
func (b *arena) budgetChecks(t *testing.T) []check {
	const flooder = "127.0.0.2"
	cached := cluster.NewWorkload(t, b.apps, "cached", "node-a")
	fresh := cluster.NewWorkload(t, b.apps, "fresh", "node-a")
	elsewhere := cluster.NewWorkload(t, b.apps, "elsewhere", "node-a")
	b.secret(cached.Token, fresh.Token, elsewhere.Token)
	evil, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	forged := func(i int) string {
		tok := signJWT(t, evil, "RS256", withClaim(boundClaims(b, b.apps, "web", b.web.Pod), "jti", fmt.Sprint(i)))
		b.secret(tok)
		return tok
	}
	req := &authpb.IstioCertificateRequest{Csr: newCSR(t, b.webID)}
	return []check{
		b.lookupCheck(),
		{name: "budget/forged-token flood from one address", defence: "peer_authn_failures", run: func(t *testing.T) {
			b.served(t, cached, "127.0.0.1") // its review is cached from now on
			for i := range 5 {
				st, _, reason := b.attempt(t, fmt.Sprintf("flood-burst-%d", i), probe{token: forged(i), from: flooder, req: req}, 10*time.Second)
				if st.Code() != codes.Unauthenticated || reason != "token_invalid" {
					t.Fatalf("forged token %d: %v %q, audit reason %q, want Unauthenticated token_invalid", i, st.Code(), st.Message(), reason)
				}
			}
			// Twelve at once, each with a second to live: past the burst,
			// their turns (one every 2 s) come after their deadlines, and
			// they are refused before a review.
			type result struct {
				st     *status.Status
				took   time.Duration
				reason string
			}
			// One connection carries them, as one client's would (the
			// address may hold few).
			conn := b.connFrom(t, flooder)
			results := make([]result, 12)
			var wg sync.WaitGroup
			for i := range results {
				wg.Go(func() {
					st, took, reason := b.attempt(t, fmt.Sprintf("flood-%d", i), probe{token: forged(100 + i), conn: conn, req: req}, time.Second)
					results[i] = result{st, took, reason}
				})
			}
			wg.Wait()
			refused := 0
			for i, r := range results {
				switch {
				case r.st.Code() == codes.ResourceExhausted && r.reason == "peer_authn_failures" &&
					strings.Contains(r.st.Message(), "too many failed authentications from this address"):
					refused++
					if r.took > 500*time.Millisecond {
						t.Errorf("flood %d: refused after %v, want at once", i, r.took)
					}
				default:
					t.Errorf("flood %d: %v %q, audit reason %q", i, r.st.Code(), r.st.Message(), r.reason)
				}
			}
			if refused != len(results) {
				t.Errorf("%d of the flood's %d requests refused for the address's failures, want all", refused, len(results))
			}
			if v := sampleValue(scrapeMetrics(t, b.s.AdminAddr), "meshca_rate_limited_total", "reason", "peer_authn_failures"); v < float64(refused) {
				t.Errorf("meshca_rate_limited_total{reason=peer_authn_failures} = %v, want at least %d", v, refused)
			}
			t.Logf("%d of %d refused for the address's failures", refused, len(results))
		}},
		{name: "budget/a neighbour of the flood, its token reviewed before", defence: "peer_authn_failures:neighbours_served",
			run: func(t *testing.T) { b.served(t, cached, flooder) }},
		// The lockout: a good token never reviewed must still be served
		// from the flooding address, after waiting its turn at most.
		{name: "budget/a neighbour of the flood, its token never reviewed", defence: "peer_authn_failures:neighbours_served",
			run: func(t *testing.T) { b.served(t, fresh, flooder) }},
		{name: "budget/another address during the flood", defence: "peer_authn_failures:per_address",
			run: func(t *testing.T) { b.served(t, elsewhere, "127.0.0.3") }},
		b.sustainedFloodCheck(flooder),
	}
}

// sustainedFloodCheck (issue 28, item 3): while a neighbour keeps the
// flooding address's review turns taken (random JWT-shaped tokens, two
// connections of two streams each: four turns, 8 s of them), a fresh
// valid token from that address, never reviewed, is served at once, and
// a fresh random one is still queued behind the flood: refused at once,
// its turn past its 6 s deadline.
func (b *arena) sustainedFloodCheck(flooder string) check {
	return check{name: "budget/a fresh token during a sustained flood from its address", defence: "peer_authn_failures:plausible_lane",
		run: func(t *testing.T) {
			const life = 6 * time.Second
			f := startFlood([]*grpc.ClientConn{b.connFrom(t, flooder), b.connFrom(t, flooder)}, 2, 30*time.Second, newCSR(t, b.webID))
			defer f.stop()
			conn := b.connFrom(t, flooder)
			api := authpb.NewIstioCertificateServiceClient(conn)
			var st *status.Status
			for i := 0; st.Code() != codes.ResourceExhausted; i++ { // once the flood holds the turns
				if i == 20 {
					t.Fatalf("random tokens from the flooding address never queued behind it: %v %q; flood %s", st.Code(), st.Message(), codeCounts(f.counts()))
				}
				time.Sleep(250 * time.Millisecond)
				_, took, err := callWithin(api, randomJWT(), newCSR(t, b.webID), life)
				if st = status.Convert(err); st.Code() == codes.ResourceExhausted && took > time.Second {
					t.Fatalf("a random token refused after %v, want at once", took)
				}
			}
			if !strings.Contains(st.Message(), "too many failed authentications from this address") {
				t.Fatalf("a random token from the flooding address: %q", st.Message())
			}
			w := cluster.NewWorkload(t, b.apps, "during-flood", "node-a")
			b.secret(w.Token)
			key, csrPEM := newKeyAndCSR(t, workloadID(w))
			ctx, cancel := context.WithTimeout(context.Background(), life)
			defer cancel()
			start := time.Now()
			resp, err := b.send(ctx, probe{token: w.Token, conn: conn, req: &authpb.IstioCertificateRequest{Csr: csrPEM, ValidityDuration: 3600}})
			took := time.Since(start)
			if err != nil || took > 2*time.Second {
				t.Fatalf("a fresh valid token from the flooding address during the flood: %v after %v, want served at once", err, took)
			}
			if _, err := checked.Check(t, resp.GetCertChain(), workloadID(w), key); err != nil {
				t.Fatal(err)
			}
			t.Logf("served in %v while the flood's requests wait their turns", took.Round(time.Millisecond))
		}}
}

// concurrencyChecks: the limits on requests at once, with a meshca of
// their own allowing one of each (--max-in-flight, --max-authn-per-peer,
// --node-proxy-max-in-flight). The requests that hold the one turn wait
// on the apiserver, paused (SIGSTOP) for a second: the next is refused
// at once, audited and counted, rather than queued.
func concurrencyChecks(t *testing.T) []check {
	m := newMesh(t, "--max-in-flight", "1", "--max-authn-per-peer", "1", "--node-proxy-max-in-flight", "1")
	c := &arena{mesh: m, roots: m.s.roots}
	ztunnel := func(node string) string {
		pod := "ztunnel-" + node
		cluster.Pod(t, m.system, pod, "ztunnel", node)
		tok := cluster.Token(t, m.system, "ztunnel", pod, []string{"istio-ca"}, time.Hour)
		w := cluster.NewWorkload(t, m.apps, "on-"+node, node)
		c.secret(tok, w.Token)
		if _, err := c.send(context.Background(), impersonate(t, tok, workloadID(w))); err != nil { // its review is cached
			t.Fatalf("ztunnel on %s: %v", node, err)
		}
		return tok
	}
	zc, zd := ztunnel("node-c"), ztunnel("node-d")
	auth := cluster.NewWorkload(t, m.apps, "auth", "node-c")
	fresh := make([]probe, 6)
	for i := range fresh {
		tok := cluster.Token(t, m.apps, "auth", auth.Pod, []string{"istio-ca"}, time.Hour)
		c.secret(tok)
		fresh[i] = probe{token: tok, from: "127.0.0.6", req: &authpb.IstioCertificateRequest{Csr: newCSR(t, workloadID(auth))}}
	}
	n := 0
	lookup := func(token string) probe { n++; return impersonate(t, token, c.id(fmt.Sprintf("made-up-%d", n))) }
	return []check{
		{name: "budget/a node proxy past its requests at once", defence: "node_proxy_in_flight", run: func(t *testing.T) {
			c.pausedRefusal(t, []probe{lookup(zc)}, lookup(zc), "this node proxy already has 1 requests in progress", "node_proxy_in_flight")
		}},
		{name: "budget/the CA past its requests at once", defence: "too_many_requests", run: func(t *testing.T) {
			c.pausedRefusal(t, []probe{lookup(zc)}, lookup(zd), "CA is at its concurrency limit", "too_many_requests")
		}},
		{name: "budget/an address past its authentications at once", defence: "too_many_authentications", run: func(t *testing.T) {
			c.pausedRefusal(t, fresh[:5], fresh[5], "too many requests from this address are authenticating at once", "too_many_authentications")
		}},
	}
}

// pausedRefusal pauses the apiserver, sends hold (each then waits on it:
// a Pod lookup, a TokenReview, or a turn behind one), and then p, which
// must be refused at once with msg and reason.
func (a *arena) pausedRefusal(t *testing.T, hold []probe, p probe, msg, reason string) {
	resume, err := cluster.PauseAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = resume()
		}
	}()
	var wg sync.WaitGroup
	for _, h := range hold {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = a.send(ctx, h)
		})
		time.Sleep(300 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-request-id", "paused-"+reason), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err = a.send(ctx, p)
	took := time.Since(start)
	resumed = true
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), msg) || took > time.Second {
		t.Errorf("got %v %q after %v, want ResourceExhausted containing %q at once", st.Code(), st.Message(), took.Round(time.Millisecond), msg)
	}
	if ev := a.auditEvent(t, "paused-"+reason); ev == nil || ev["decision"] != "denied" || ev["reason"] != reason {
		t.Errorf("audit event %v, want denied for %s", ev, reason)
	}
	if v := sampleValue(scrapeMetrics(t, a.s.AdminAddr), "meshca_rate_limited_total", "reason", reason); v < 1 {
		t.Errorf("meshca_rate_limited_total{reason=%q} = %v, want at least 1", reason, v)
	}
}
