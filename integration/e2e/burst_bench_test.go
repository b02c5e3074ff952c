package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// BenchmarkNodeRestartBurst: 10 nodes restart at once and each node's
// ztunnel (its own connection and a fresh token, so the TokenReview cache
// starts cold) asks for the SVIDs of its 110 Pods at the same moment:
// 1,100 impersonated requests against the real apiserver. It reports p50,
// p99 and the total time, and each as a multiple of one request's latency
// measured in the same run.
func BenchmarkNodeRestartBurst(b *testing.B) {
	const nodes, podsPerNode = 10, 110
	// The ztunnels all connect from 127.0.0.1 (in a cluster, each from
	// its node's address): 1,100 requests from one address before their
	// tokens are reviewed, past --max-unauthenticated-streams-per-peer.
	m := newMesh(b, "--max-unauthenticated-streams-per-peer=0")
	ztunnels := make([]*harness.Workload, nodes)
	ids := make([][]spiffeid.ID, nodes)
	parallel(b, nodes*podsPerNode, func(i int) {
		node, slot := i/podsPerNode, i%podsPerNode
		sa := fmt.Sprintf("w-%d-%d", node, slot)
		cluster.ServiceAccount(b, m.apps, sa)
		cluster.Pod(b, m.apps, sa+"-0", sa, fmt.Sprintf("node-%d", node))
	})
	for n := range nodes {
		pod := fmt.Sprintf("ztunnel-n%d", n)
		cluster.Pod(b, m.system, pod, "ztunnel", fmt.Sprintf("node-%d", n))
		ztunnels[n] = &harness.Workload{Namespace: m.system, ServiceAccount: "ztunnel", Pod: pod}
		for slot := range podsPerNode {
			ids[n] = append(ids[n], m.id(fmt.Sprintf("w-%d-%d", n, slot)))
		}
	}

	// One request's latency: a warm connection and a warm cache.
	single := m.s.client(b, m.ztunnelA.Token)
	cluster.NewWorkload(b, m.apps, "probe", "node-a")
	var one []time.Duration
	for range 31 {
		start := time.Now()
		if _, err := single.Fetch(context.Background(), m.id("probe"), caclient.Options{Impersonate: true}); err != nil {
			b.Fatal(err)
		}
		one = append(one, time.Since(start))
	}
	slices.Sort(one)
	singleLatency := one[len(one)/2]

	var p50, p99, total time.Duration
	for b.Loop() {
		clients := make([]*checked.Client, nodes)
		for n := range nodes {
			// A restarted ztunnel has a new token.
			ztunnels[n].Token = cluster.Token(b, m.system, "ztunnel", ztunnels[n].Pod, []string{"istio-ca"}, time.Hour)
			clients[n] = m.s.client(b, ztunnels[n].Token)
		}
		lat := make([]time.Duration, 0, nodes*podsPerNode)
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := time.Now()
		for n := range nodes {
			for _, id := range ids[n] {
				wg.Go(func() {
					t0 := time.Now()
					_, err := clients[n].Fetch(context.Background(), id, caclient.Options{Impersonate: true})
					d := time.Since(t0)
					if err != nil {
						b.Errorf("%s via ztunnel on node-%d: %v", id, n, err)
					}
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				})
			}
		}
		wg.Wait()
		total = time.Since(start)
		slices.Sort(lat)
		p50, p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(singleLatency), "single-ms")
	b.ReportMetric(ms(p50), "p50-ms")
	b.ReportMetric(ms(p99), "p99-ms")
	b.ReportMetric(ms(total), "total-ms")
	b.ReportMetric(float64(p50)/float64(singleLatency), "p50-x-single")
	b.ReportMetric(float64(p99)/float64(singleLatency), "p99-x-single")
	b.ReportMetric(float64(total)/float64(singleLatency), "total-x-single")
}

// parallel runs f(0..n-1) on 16 goroutines.
func parallel(tb testing.TB, n int, f func(i int)) {
	tb.Helper()
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
