package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/load"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
)

// burstRound is one node-restart burst and the steady load after it.
type burstRound struct {
	slowest     time.Duration
	vsSteady    float64 // burst req/s over steady req/s
	cpuVsSteady float64 // meshca's CPU per request, burst over steady
}

// burst restarts every node at once, o.bursts times: each ztunnel has a
// new token (the TokenReview cache has never seen it) and a new connection
// (a TLS handshake), and asks for the certificates of all of its Pods at
// once. Right after each burst, the same connections, now warm, carry the
// same concurrency for o.d: the steady throughput the burst is held to.
func (r *report) burst(ctx context.Context, o options, t load.Target, cluster *harness.Cluster, nodes []*node, admin string, m *load.Meter) error {
	perConn := make([][]*authpb.IstioCertificateRequest, len(nodes))
	for i, n := range nodes {
		var err error
		if perConn[i], _, err = load.Requests(n.ids, 1, true); err != nil {
			return err
		}
	}
	total := len(nodes) * o.perNode
	// A meshca that has served for a while: its own warm-up (stacks, heap,
	// the issuing path) is not a node restart's. A few hundred requests,
	// well within the ztunnel's budget (--node-proxy-burst).
	warm, err := t.DialN(1, nodes[0].token, perConn[0][0])
	if err != nil {
		return err
	}
	load.Sustain(16, func(_, i int) error { return warm[0].Call(perConn[0][i%len(perConn[0])]) }, 0, 300*time.Millisecond, nil)
	load.CloseAll(warm)
	fmt.Printf("\nnode-restart burst: %d nodes x %d Pods at once, each ztunnel with a new token and a new connection, on a\n", len(nodes), o.perNode)
	fmt.Printf("meshca with its default limits but a node proxy's rate, warmed up; steady: the same connections and concurrency,\n")
	fmt.Printf("warm, for %v right after\n", o.d)
	fmt.Printf("cpu x-stdy: meshca's CPU per request in the burst over the steady load's\n\n")
	fmt.Printf("%5s | %6s %8s %8s %8s %8s | %8s %8s | %6s %10s | %s\n", "burst", "served", "p50 ms", "p99 ms", "max ms", "total ms",
		"req/s", "steady", "x-stdy", "cpu x-stdy", "load average")
	for round := 1; round <= o.bursts; round++ {
		if err := renewTokens(ctx, cluster.Client, nodes); err != nil {
			return err
		}
		conns := make([]*load.Conn, len(nodes))
		var calls []func() error
		for i, n := range nodes {
			c, err := t.Dial(n.token)
			if err != nil {
				load.CloseAll(conns)
				return err
			}
			conns[i] = c
			for _, req := range perConn[i] {
				calls = append(calls, func() error { return c.Call(req) })
			}
		}
		prof := r.profileBurst(o, admin, round, "burst", 0)
		b := load.Burst(calls, m)
		if err := prof(); err != nil {
			return err
		}
		prof = r.profileBurst(o, admin, round, "steady", o.warmup)
		steady := load.Sustain(total, func(stream, i int) error {
			n := stream % len(conns)
			return conns[n].Call(perConn[n][(i/len(conns))%len(perConn[n])])
		}, o.warmup, o.d, m)
		if err := prof(); err != nil {
			return err
		}
		r.burstServed, r.steadyRate = r.burstServed+b.N, append(r.steadyRate, steady.Rate())
		load.CloseAll(conns)
		br := burstRound{slowest: b.Pct(1), vsSteady: b.Rate() / steady.Rate()}
		if s := steady.CPUPerReq("meshca"); s > 0 {
			br.cpuVsSteady = float64(b.CPUPerReq("meshca")) / float64(s)
		}
		r.bursts = append(r.bursts, br)
		fmt.Printf("%5d | %6d %8.2f %8.2f %8.2f %8.2f | %8.0f %8.0f | %6.2f %10.2f | %s\n", round, b.N, ms(b.Pct(0.5)), ms(b.Pct(0.99)),
			ms(br.slowest), ms(b.Elapsed), b.Rate(), steady.Rate(), br.vsSteady, br.cpuVsSteady, load.LoadAvg())
		switch {
		case b.Errs > 0:
			r.fail("burst %d: %d of %d requests failed, the first: %v", round, b.Errs, total, b.FirstErr)
		case steady.Errs > 0:
			r.fail("steady load after burst %d: %d requests failed, the first: %v", round, steady.Errs, steady.FirstErr)
		}
	}
	return nil
}

// profileBurst starts, with -profile, a CPU profile of meshca after delay
// (2 s for a burst, 1 s of a steady load), and returns a func that waits
// for it. The burst and the steady
// load profiles of every round are compared at the end (burstProfiles).
func (r *report) profileBurst(o options, admin string, round int, phase string, delay time.Duration) func() error {
	if o.profile == "" {
		return func() error { return nil }
	}
	file := filepath.Join(o.profile, fmt.Sprintf("meshca-%s-%d.pb.gz", phase, round))
	done := make(chan error, 1)
	go func() {
		time.Sleep(delay)
		secs := 1
		if phase == "burst" {
			secs = 2 // all of a burst; its idle end adds no samples
		}
		done <- load.Fetch(admin, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), file)
	}()
	if phase == "burst" {
		r.burstProfiles = append(r.burstProfiles, file)
	} else {
		r.steadyProfiles = append(r.steadyProfiles, file)
	}
	return func() error { return <-done }
}

// compareProfiles prints where meshca's CPU went in the bursts and in the
// steady loads after them, per request.
func (r *report) compareProfiles() error {
	if len(r.burstProfiles) == 0 {
		return nil
	}
	steadyN := 0.0
	for _, rate := range r.steadyRate {
		steadyN += rate // requests in the 1 s profiled
	}
	for _, p := range []struct {
		name  string
		files []string
		n     int
	}{{"bursts", r.burstProfiles, r.burstServed}, {"steady loads", r.steadyProfiles, int(steadyN)}} {
		shares, err := load.Breakdown(load.MeshcaCategories, p.files...)
		if err != nil {
			return err
		}
		fmt.Printf("\nwhere meshca's CPU went in the %s (%d profiles)\n", p.name, len(p.files))
		load.PrintBreakdown(os.Stdout, shares, p.n)
	}
	return nil
}
