package faults

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/load"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// dial opens a load connection with token, closed at cleanup.
func dial(t *testing.T, target load.Target, token string) *load.Conn {
	t.Helper()
	c, err := target.Dial(token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// requests are n impersonated requests for each of ids, built once.
func requests(t *testing.T, ids []spiffeid.ID, n int) []*authpb.IstioCertificateRequest {
	t.Helper()
	reqs, _, err := load.Requests(ids, n, true)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// nth is the i-th of reqs, round and round.
func nth(reqs []*authpb.IstioCertificateRequest, i int) *authpb.IstioCertificateRequest {
	return reqs[i%len(reqs)]
}

// TestAPIServerOutage makes the kube-apiserver hang (paused) and then
// crash (killed) under load, and brings it back each time, meshca running
// throughout:
//
//   - a ztunnel whose token meshca has reviewed keeps getting its
//     workloads' certificates: the review is cached and the Pods are in
//     meshca's index;
//   - what needs the apiserver fails with Unavailable within the request
//     timeout, never with a refusal the client would not retry: a token
//     never reviewed, and a workload missing from the index (its absence
//     is confirmed with the apiserver before PermissionDenied);
//   - once the apiserver is back (the same process resumed; a new one on
//     the same etcd, certificates and port), all of it succeeds again
//     within a bound, the tokens refused during the outage included: a
//     failed review is not remembered.
func TestAPIServerOutage(t *testing.T) {
	noLeaks(t)
	m := newMesh(t, 8)
	s := harness.StartSelfSigned(t, bin, cluster.Kubeconfig, m.args(requestTimeout)...)
	zt := dial(t, load.Target{Addr: s.Addr, Roots: s.Roots}, m.token)
	workload := requests(t, m.ids, 4)
	absent := requests(t, []spiffeid.ID{m.absent}, 1)
	warm := call(zt, workload[0])
	if !served.matches(warm) {
		t.Fatalf("first request: %v", warm)
	}
	harness.CheckReply(t, warm.reply)
	if o := call(zt, absent[0]); !notOnNode.matches(o) {
		t.Fatalf("workload not on the node: %v, want %v", o, notOnNode)
	}

	since := time.Now() // the previous fault is over
	cached := startStream(t, "reviewed token", 2, 20*time.Millisecond, func(i int) outcome { return call(zt, nth(workload, i)) })
	// Misses are confirmed at most 20 times a second (ca/kube.PodIndex):
	// stay under it, so that only the outage makes them fail.
	missing := startStream(t, "workload not on the node", 2, 250*time.Millisecond, func(i int) outcome { return call(zt, nth(absent, i)) })
	// A restarted ztunnel: a new token on its connection, never reviewed.
	// Each fault has tokens of its own, minted before it (TokenRequest
	// needs the apiserver); they go round, and since a failed review is
	// not cached each needs the apiserver until one succeeds.
	// They are handed to the stream only once the fault holds: one used
	// a moment before it would be reviewed then, and served from the
	// cache during the fault.
	var fresh atomic.Pointer[[]string]
	var next atomic.Int64
	newTokens := func() []string {
		toks := make([]string, 16)
		for i := range toks {
			toks[i] = m.freshToken(t)
		}
		return toks
	}
	first := newTokens()
	fresh.Store(&first)
	unreviewed := startStream(t, "unreviewed token", 3, 100*time.Millisecond, func(i int) outcome {
		// The call counts from before the tokens are picked, so that
		// one starting after a fault's tokens were handed over has them.
		start := time.Now()
		toks := *fresh.Load()
		o := call(zt.WithToken(toks[next.Add(1)%int64(len(toks))]), nth(workload, i))
		o.start = start
		return o
	})
	time.Sleep(time.Second)

	ctx := context.Background()
	var resume func() error
	t.Cleanup(func() { // whatever happens: the cluster serves the other tests
		if resume != nil {
			_ = resume()
		}
	})
	for _, f := range []struct {
		name       string
		fail, heal func(t *testing.T)
		// lasts is how long the fault is held: a hung apiserver answers
		// at the deadline, and each stream must see one such answer at
		// least, whatever it had in progress when the fault came.
		lasts time.Duration
	}{
		{
			name:  "hung",
			lasts: 2*requestTimeout + time.Second,
			fail: func(t *testing.T) {
				var err error
				if resume, err = cluster.PauseAPIServer(); err != nil {
					t.Fatal(err)
				}
			},
			heal: func(t *testing.T) {
				if err := resume(); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name:  "killed",
			lasts: 3 * time.Second,
			fail: func(t *testing.T) {
				if err := cluster.KillAPIServer(ctx); err != nil {
					t.Fatal(err)
				}
			},
			heal: func(t *testing.T) {
				if err := cluster.StartAPIServer(ctx); err != nil {
					t.Fatal(err)
				}
			},
		},
	} {
		toks := newTokens()
		failing := time.Now()
		f.fail(t)
		fresh.Store(&toks)
		failed := time.Now()
		time.Sleep(f.lasts)
		healing := time.Now()
		f.heal(t)
		healed := time.Now()
		// Recovery, without restarting meshca.
		recovered := healed
		for _, r := range []struct {
			s *stream
			w want
		}{{unreviewed, served}, {missing, notOnNode}} {
			o := r.s.waitFor(t, healed, r.w, 30*time.Second)
			recovered = later(recovered, o.end)
		}
		time.Sleep(time.Second)
		done := time.Now()
		harness.Report(t, "apiserver %s: in %v, back in %v, meshca served all again %v after", f.name, failed.Sub(failing).Round(time.Millisecond),
			healed.Sub(healing).Round(time.Millisecond), recovered.Sub(healed).Round(time.Millisecond))

		bound := requestTimeout + margin
		for _, w := range []struct {
			s        *stream
			when     string
			from, to time.Time
			wants    []want
		}{
			{cached, "before", since, failing, []want{served}},
			{cached, "from the fault on", failing, done, []want{served, reviewDown, podsDown}},
			{missing, "before", since, failing, []want{notOnNode}},
			{missing, "failed", failed, healing, []want{podsDown}},
			{missing, "failing to recovered", failing, recovered, []want{notOnNode, podsDown}},
			{missing, "recovered", recovered, done, []want{notOnNode}},
			{unreviewed, "failed", failed, healing, []want{reviewDown}},
			{unreviewed, "healing to recovered", healing, recovered, []want{served, reviewDown}},
			{unreviewed, "recovered", recovered, done, []want{served}},
		} {
			what := "apiserver " + f.name + ": " + w.s.name + ", " + w.when
			outs := w.s.within(w.from, w.to)
			counts := check(t, what, outs, w.wants...)
			p99, slowest := failFast(t, what, outs, bound)
			t.Logf("%s: %d answers, %v of %v; failures p99 %v, slowest %v", what, len(outs), counts, w.wants,
				p99.Round(time.Millisecond), slowest.Round(time.Millisecond))
		}
		for _, s := range []*stream{cached, missing, unreviewed} {
			if len(s.within(failed, healing)) == 0 {
				t.Errorf("apiserver %s: no request of %s was answered while it was", f.name, s.name)
			}
		}
		if count(cached.within(failed, healing), served) == 0 {
			t.Errorf("apiserver %s: no request with a reviewed token was served", f.name)
		}
		since = done
	}
	if st := s.Exited(); st != nil {
		t.Fatalf("meshca exited: %v", st)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
